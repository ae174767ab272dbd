//! `inspect counters`, `maps`, `interfaces` and `programs`: what the kernel
//! says about the datapath, through [`crate::modes::ebpf::introspect`].

use std::collections::BTreeMap;

use serde::Serialize;

use super::table::Table;
use crate::modes::ebpf::introspect::{
    BpfStats, CgroupHook, InterfaceAttachments, MapUsage, ProgramStats,
};

#[derive(Clone, Debug, Serialize)]
pub struct CountersReport {
    /// Every counter by name, summed over the CPUs.
    pub counters: BTreeMap<&'static str, u64>,
}

impl CountersReport {
    pub fn new(counters: Vec<(&'static str, u64)>) -> Self {
        CountersReport {
            counters: counters.into_iter().collect(),
        }
    }

    pub fn text(&self) -> String {
        let mut t = Table::new(&["COUNTER", "VALUE"]);
        for (name, value) in &self.counters {
            t.row(vec![(*name).into(), value.to_string()]);
        }
        t.render()
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct MapsReport {
    pub maps: Vec<MapUsage>,
}

impl MapsReport {
    pub fn text(&self) -> String {
        let mut t = Table::new(&["MAP", "TYPE", "ENTRIES", "CAPACITY", "FILL"]);
        for m in &self.maps {
            t.row(vec![
                m.name.clone(),
                m.map_type.clone(),
                m.entries.map_or_else(|| "-".into(), |e| e.to_string()),
                m.capacity.to_string(),
                m.fill()
                    .map_or_else(|| "-".into(), |f| format!("{:.1}%", f * 100.0)),
            ]);
        }
        t.render()
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct InterfacesReport {
    pub interfaces: Vec<InterfaceAttachments>,
    pub cgroup_hooks: Vec<CgroupHook>,
    /// False before Linux 6.6: TC programs attached as cls_bpf are not listed.
    pub tcx_supported: bool,
}

impl InterfacesReport {
    pub fn text(&self) -> String {
        let mut t = Table::new(&["INTERFACE", "IFINDEX", "HOOK", "PROGRAM", "ID"]);
        for iface in &self.interfaces {
            for a in &iface.attachments {
                t.row(vec![
                    iface.name.clone(),
                    iface.ifindex.to_string(),
                    a.hook.name().into(),
                    a.program.clone(),
                    a.program_id.to_string(),
                ]);
            }
        }
        let mut out = if t.is_empty() {
            "no interface of this network namespace runs the datapath's programs (run inspect in the agent's namespace)\n".to_owned()
        } else {
            t.render()
        };
        if !self.tcx_supported {
            out.push_str("this kernel has no tcx (Linux 6.6): TC programs attached as cls_bpf filters are not listed\n");
        }
        let mut c = Table::new(&["SOCKET HOOK", "ID", "CGROUP"]);
        for h in &self.cgroup_hooks {
            c.row(vec![
                h.program.clone(),
                h.program_id.to_string(),
                h.cgroup_path.as_ref().map_or_else(
                    || format!("cgroup id {}", h.cgroup_id),
                    |p| p.display().to_string(),
                ),
            ]);
        }
        out.push('\n');
        if c.is_empty() {
            out.push_str("no socket hooks attached\n");
        } else {
            out.push_str(&c.render());
        }
        out
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ProgramsReport {
    /// `kernel.bpf_stats_enabled`: run time and count move only while on.
    pub bpf_stats: BpfStats,
    pub programs: Vec<ProgramStats>,
}

impl ProgramsReport {
    pub fn text(&self) -> String {
        let mut t = Table::new(&["PROGRAM", "ID", "RUNS", "RUN TIME", "AVG"]);
        for p in &self.programs {
            let avg = p
                .run_time_ns
                .checked_div(p.run_count)
                .map_or_else(|| "-".into(), |ns| format!("{ns}ns"));
            t.row(vec![
                p.name.clone(),
                p.id.to_string(),
                p.run_count.to_string(),
                format!("{:.3}ms", p.run_time_ns as f64 / 1e6),
                avg,
            ]);
        }
        let stats = match self.bpf_stats {
            BpfStats::On => "BPF stats: on (kernel.bpf_stats_enabled = 1)\n",
            BpfStats::Off => {
                "BPF stats: off (kernel.bpf_stats_enabled = 0): run time and count move only while \
                 it is 1 or a process holds BPF_ENABLE_STATS; inspect never turns it on\n"
            }
            BpfStats::Unknown => "BPF stats: unknown (kernel.bpf_stats_enabled unreadable)\n",
        };
        format!("{stats}{}", t.render())
    }
}
