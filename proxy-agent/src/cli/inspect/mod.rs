//! `proxy-agent inspect`: what a running agent's datapath holds and does,
//! for operators. Read-only: the pinned maps ([`crate::cli::pins`]), the
//! kernel's view of programs and attachments
//! ([`crate::modes::ebpf::introspect`]) and the names the agent publishes
//! ([`names`]). Human tables by default, `--output json` for scripts.
//!
//! ```text
//! args -> pinned maps + names file -> services | conntrack | kernel -> text | json
//! ```

pub mod args;
pub mod conntrack;
pub mod kernel;
pub mod names;
pub mod services;
pub mod table;

use std::{collections::BTreeSet, process::ExitCode};

use anyhow::Context as _;
use aya::maps::IterableMap as _;
use proxy_common::{V4, V6};
use serde::Serialize;

use args::{InspectArgs, ServiceFilter, What};
use names::Naming;
use services::ServiceTables;

use crate::{
    cli::{fail, pins::PinnedMaps},
    modes::ebpf::{
        introspect::{self, PinnedMapSet},
        sockets,
    },
};

/// Runs `proxy-agent inspect`: the report on stdout, or one line of error
/// on stderr and exit 1.
pub fn main(args: InspectArgs) -> ExitCode {
    if let Err(e) = args.check() {
        return fail(e);
    }
    match run(&args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("{e:#}")),
    }
}

/// The rendered report.
pub fn run(args: &InspectArgs) -> anyhow::Result<String> {
    let dir = args.pins.dir();
    let pinned = PinnedMaps::open(&dir)?;
    let set = PinnedMapSet::open(&dir).context("--pin-dir")?;
    let naming = || -> anyhow::Result<(ServiceTables, Naming)> {
        let tables = ServiceTables::read(&pinned.maps)?;
        let naming = Naming::load(&args.state_dir, &tables.service_ids(), &tables.backends);
        Ok((tables, naming))
    };
    let out = args.output;
    match args.what {
        What::Services => {
            let (tables, naming) = naming()?;
            let only = args
                .service
                .as_ref()
                .map(|f| service_ids(f, &tables, &naming))
                .transpose()?;
            let report = services::services(&tables, &naming, only.as_ref());
            out.render(&report, services::ServicesReport::text)
        }
        What::Backends => {
            let (tables, naming) = naming()?;
            let report = services::backends(&tables, &naming, args.endpoint.as_ref());
            out.render(&report, services::BackendsReport::text)
        }
        What::Conntrack => {
            let (tables, naming) = naming()?;
            let filter = conntrack::Filter {
                service_ids: args
                    .service
                    .as_ref()
                    .map(|f| service_ids(f, &tables, &naming))
                    .transpose()?,
                endpoint: args.endpoint,
                client: args.client,
            };
            let capacity6 = pinned
                .maps
                .v6
                .conntrack
                .map()
                .info()
                .map_or(0, |i| i.max_entries());
            let capacity = pinned.sizes.conntrack + capacity6;
            let opts = conntrack::Options {
                filter: &filter,
                limit: args.limit,
                top: args.top,
                capacity,
                now_ns: crate::clock::monotonic_ns(),
            };
            let entries4 = pinned.maps.conntrack.iter().filter_map(Result::ok);
            let entries6 = pinned.maps.v6.conntrack.iter().filter_map(Result::ok);
            let entries = (entries4.map(|(k, v)| conntrack::Flow::of::<V4>(&k, &v)))
                .chain(entries6.map(|(k, v)| conntrack::Flow::of::<V6>(&k, &v)));
            let mut report = conntrack::report(entries, &naming, &opts);
            report.collector = collector(&dir, opts.now_ns)?;
            out.render(&report, conntrack::ConntrackReport::text)
        }
        What::Counters => out.render(
            &kernel::CountersReport::new(set.counters()?),
            kernel::CountersReport::text,
        ),
        What::Maps => out.render(
            &kernel::MapsReport { maps: set.usage()? },
            kernel::MapsReport::text,
        ),
        What::Interfaces => out.render(&interfaces(&set)?, kernel::InterfacesReport::text),
        What::Programs => out.render(&programs(&set)?, kernel::ProgramsReport::text),
        What::Summary => {
            let (tables, naming) = naming()?;
            let summary = Summary {
                names: naming.status.clone(),
                frontends: services::services(&tables, &naming, None).frontends.len(),
                backends: tables.backends.len(),
                maps: set.usage()?,
                counters: kernel::CountersReport::new(set.counters()?).counters,
                interfaces: interfaces(&set)?,
                programs: programs(&set)?,
            };
            out.render(&summary, Summary::text)
        }
    }
}

/// The collector's counts, from its pinned map (none before ABI 8 pinned it).
fn collector(
    dir: &std::path::Path,
    now_ns: u64,
) -> anyhow::Result<Option<conntrack::CollectorView>> {
    let path = dir.join(proxy_common::maps::CT_COLLECTOR);
    if !path.exists() {
        return Ok(None);
    }
    let map = aya::maps::MapData::from_pin(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let stats = crate::modes::ebpf::collector::read(&map)?;
    Ok(Some(conntrack::CollectorView::of(&stats, now_ns)))
}

fn interfaces(set: &PinnedMapSet) -> anyhow::Result<kernel::InterfacesReport> {
    let programs = introspect::our_programs(&set.ids())?;
    let found = introspect::interfaces(&programs)?;
    let cgroup2 = sockets::cgroup2_mount().ok();
    Ok(kernel::InterfacesReport {
        interfaces: found.interfaces,
        cgroup_hooks: introspect::cgroup_hooks(&programs, cgroup2.as_deref())?,
        tcx_supported: found.tcx_supported,
    })
}

fn programs(set: &PinnedMapSet) -> anyhow::Result<kernel::ProgramsReport> {
    Ok(kernel::ProgramsReport {
        bpf_stats: introspect::bpf_stats(),
        programs: introspect::our_programs(&set.ids())?,
    })
}

/// The service ids `--service` names. Names are needed: without the file,
/// or when nothing matches, the error says so.
pub(crate) fn service_ids(
    filter: &ServiceFilter,
    tables: &ServiceTables,
    naming: &Naming,
) -> anyhow::Result<BTreeSet<u32>> {
    if naming.status.state == "missing" || naming.status.state == "unreadable" {
        anyhow::bail!(
            "--service: needs the names the agent publishes ({})",
            naming.status.note.clone().unwrap_or_default()
        );
    }
    // A port number matches the service ports with a frontend on that port.
    let ports_of = |id: u32| -> BTreeSet<u16> {
        tables
            .entries
            .iter()
            .filter(|(k, v)| {
                k.slot == 0
                    && v.service_id == id
                    && v.kind() == proxy_common::FrontendKind::ClusterIp
            })
            .map(|(k, _)| u16::from_be(k.port_be))
            .collect()
    };
    let ids = naming.service_ids_where(|s| {
        s.namespace == filter.namespace
            && s.name == filter.name
            && filter.port.as_ref().is_none_or(|p| {
                *p == s.port_name || p.parse::<u16>().is_ok_and(|n| ports_of(s.id).contains(&n))
            })
    });
    if ids.is_empty() {
        anyhow::bail!(
            "--service: no service port {}/{}{} is programmed",
            filter.namespace,
            filter.name,
            filter
                .port
                .as_ref()
                .map(|p| format!(":{p}"))
                .unwrap_or_default()
        );
    }
    Ok(ids)
}

#[derive(Serialize)]
struct Summary {
    names: names::NamesStatus,
    frontends: usize,
    backends: usize,
    maps: Vec<introspect::MapUsage>,
    counters: std::collections::BTreeMap<&'static str, u64>,
    interfaces: kernel::InterfacesReport,
    programs: kernel::ProgramsReport,
}

impl Summary {
    fn text(&self) -> String {
        let nonzero: Vec<String> = self
            .counters
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!(
            "{}{} frontends, {} backends\n\n{}\ncounters: {}\n\n{}\n{}",
            services::naming_line(&self.names),
            self.frontends,
            self.backends,
            kernel::MapsReport {
                maps: self.maps.clone()
            }
            .text(),
            if nonzero.is_empty() {
                "all zero".into()
            } else {
                nonzero.join(" ")
            },
            self.interfaces.text(),
            self.programs.text(),
        )
    }
}
