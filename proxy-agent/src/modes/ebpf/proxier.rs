use std::time::{Duration, Instant};

use aya::maps::IterableMap as _;
use proxy_common::{V4, V6};

use tracing::{debug, info, warn};

use super::introspect::{MapUsage, map_usage};
use super::programs_ready::ProgramsReady;
use super::{
    EbpfNodeSettings, KernelMaps, MapError, NodeFacts, NodeProgrammer, Programmer, node_facts,
    publish::NamesPublisher, stale_sockets,
};
use crate::{
    metrics::ConntrackReconcilerMetrics,
    model::{DesiredState, NodeModel},
    sync::{Proxier, SyncChanges},
};

/// The ebpf mode's [`Proxier`]: programs the service maps from the desired
/// state, and the node maps from the node model it carries.
pub struct EbpfProxier {
    maps: KernelMaps,
    programmer: Programmer,
    node_programmer: NodeProgrammer,
    settings: EbpfNodeSettings,
    /// `None` before the first sync of adopted maps.
    applied: Option<NodeFacts>,
    /// The maps were pinned by an earlier agent: the first sync takes them over.
    adopting: bool,
    /// Fresh maps not synced yet: the first sync writes frontends and
    /// backends in batches ([`KernelMaps::defer_writes`]).
    cold_start: bool,
    conntrack_fill: ConntrackFill,
    /// Publishes what the maps' ids stand for; `None`: not published.
    names: Option<NamesPublisher>,
    names_published_at: Option<Instant>,
    /// Until the first sync has waited for them: the packet programs being
    /// verified.
    programs: Option<ProgramsReady>,
    /// Upstream's reconciler metrics, fed by the UDP flow flushes.
    conntrack_metrics: ConntrackReconcilerMetrics,
}

/// How often the conntrack table's fill is measured (a walk of its entries).
const FILL_INTERVAL: Duration = Duration::from_secs(60);
/// The least time between two publications of the names after partial syncs.
const NAMES_MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Above this share of its capacity the table is reported as nearly full.
const FILL_WARNING: f64 = 0.9;

/// Watches the conntrack table fill up: a full table refuses new flows (as
/// the kernel's conntrack drops them) until the collector frees expired
/// flows, and under that pressure the unanswered ones.
#[derive(Debug, Default)]
struct ConntrackFill {
    last: Option<Instant>,
}

impl ConntrackFill {
    fn check(&mut self, maps: &KernelMaps) {
        if self.last.is_some_and(|t| t.elapsed() < FILL_INTERVAL) {
            return;
        }
        self.last = Some(Instant::now());
        // Counted in batches, not a call per entry on the sync's thread.
        let usage = map_usage(proxy_common::maps::CONNTRACK, maps.conntrack.map());
        let Ok(MapUsage {
            capacity,
            entries: Some(entries),
            ..
        }) = usage
        else {
            return;
        };
        let entries = entries as usize;
        let (fill, nearly_full) = fill_level(entries, capacity);
        if nearly_full {
            warn!(
                entries,
                capacity,
                fill = format!("{:.0}%", fill * 100.0),
                "the conntrack table is nearly full: when full it refuses new flows until \
                 flows expire (raise conntrack.maxPerCore / min or the extension's maps.conntrack)"
            );
        } else {
            info!(
                entries,
                capacity,
                fill = format!("{:.0}%", fill * 100.0),
                "conntrack table"
            );
        }
    }
}

impl EbpfProxier {
    /// Writes the node facts of `node` right away, so the datapath knows the
    /// node before any program is attached.
    pub fn new(
        mut maps: KernelMaps,
        settings: EbpfNodeSettings,
        node: &NodeModel,
    ) -> Result<Self, MapError> {
        let conntrack_metrics = flush_in_background(&mut maps);
        let mut node_programmer = NodeProgrammer::new();
        let mut programmer = fresh_programmer(&maps, &settings);
        let facts = node_facts(&settings, node);
        node_programmer.apply(&facts, &mut maps)?;
        programmer.set_node_addresses(
            &facts.addresses,
            &facts.addresses6,
            &DesiredState::default(),
            &mut maps,
        )?;
        Ok(Self {
            maps,
            programmer,
            node_programmer,
            settings,
            applied: Some(facts),
            adopting: false,
            cold_start: true,
            conntrack_fill: ConntrackFill::default(),
            names: None,
            names_published_at: None,
            programs: None,
            conntrack_metrics,
        })
    }

    /// Over maps an earlier agent pinned: nothing is written before the first
    /// sync (which runs once Services and EndpointSlices were listed), which
    /// then takes over what they hold and writes only what differs.
    pub fn adopting(mut maps: KernelMaps, settings: EbpfNodeSettings) -> Self {
        let conntrack_metrics = flush_in_background(&mut maps);
        let programmer = fresh_programmer(&maps, &settings);
        Self {
            maps,
            programmer,
            node_programmer: NodeProgrammer::new(),
            settings,
            applied: None,
            adopting: true,
            cold_start: false,
            conntrack_fill: ConntrackFill::default(),
            names: None,
            names_published_at: None,
            programs: None,
            conntrack_metrics,
        }
    }

    /// The metrics of the UDP flow flushes, to be served.
    pub fn conntrack_metrics(&self) -> ConntrackReconcilerMetrics {
        self.conntrack_metrics.clone()
    }

    /// Publishes what the maps' ids stand for after every sync that changed them.
    pub fn publishing_names(mut self, publisher: NamesPublisher) -> Self {
        self.names = Some(publisher);
        self
    }

    /// The first sync writes the maps, then waits for `programs` to be
    /// attached before it reports done.
    pub fn waiting_for(mut self, programs: ProgramsReady) -> Self {
        self.programs = Some(programs);
        self
    }

    fn publish_names(&mut self, desired: &DesiredState, changes: &SyncChanges) {
        let touched = self.programmer.take_touched();
        let Some(names) = self.names.as_mut() else {
            return;
        };
        names.note(changes, touched);
        if !names.has_news() {
            return;
        }
        // Writing the names walks every service (about 100 ms at 50,000, on
        // the writer's thread): a burst of changes publishes them at most
        // once a second, the rest at the next sync after that (syncPeriod
        // at the latest).
        let recent = self
            .names_published_at
            .is_some_and(|t| t.elapsed() < NAMES_MIN_INTERVAL);
        if recent && !changes.full {
            return;
        }
        names.publish(&self.programmer, desired);
        self.names_published_at = Some(Instant::now());
    }

    /// After a failed batch the maps hold part of what the programmer
    /// believes it wrote: the next sync takes over what they do hold, as
    /// after a restart, and writes the rest.
    fn start_over(&mut self) {
        self.maps.discard_deferred();
        self.programmer = fresh_programmer(&self.maps, &self.settings);
        if let Some(names) = self.names.as_mut() {
            names.start_over();
        }
        self.node_programmer = NodeProgrammer::new();
        self.applied = None;
        self.adopting = true;
    }

    fn adopt(&mut self, desired: &DesiredState) -> Result<(), MapError> {
        let facts = node_facts(&self.settings, &desired.node);
        let services = self.maps.service_snapshot::<V4>()?;
        let services6 = self.maps.service_snapshot::<V6>()?;
        self.node_programmer = NodeProgrammer::adopt(&self.maps.node_snapshot()?);
        let stats = self.programmer.adopt(
            (&services, &services6),
            desired,
            (&facts.addresses, &facts.addresses6),
        );
        if let Some(names) = self.names.as_mut() {
            names.start_over();
        }
        info!(
            frontends = stats.frontends,
            backends = stats.backends,
            stale_frontends = stats.stale_frontends,
            "took over the pinned service maps"
        );
        self.adopting = false;
        Ok(())
    }

    /// Connected UDP sockets of this node the socket hooks pointed at an
    /// endpoint that no longer serves: ended, so clients reconnect to a live one.
    fn end_stale_udp_sockets(&mut self) {
        let gone = self.programmer.take_gone_udp();
        if gone.is_empty() || !self.settings.socket_lb.enabled {
            return;
        }
        match stale_sockets::forget_and_terminate(&gone, &mut self.maps) {
            Ok(done) if done.forgotten + done.destroyed > 0 => info!(
                frontends = gone.len(),
                socket_choices_forgotten = done.forgotten,
                connected_sockets_destroyed = done.destroyed,
                "ended UDP sockets pointed at endpoints that no longer serve"
            ),
            Ok(_) => {}
            Err(e) => warn!(
                error = %e,
                "cannot end connected UDP sockets pointed at endpoints that no longer serve (sock_diag \
                 SOCK_DESTROY needs CONFIG_INET_DIAG_DESTROY): they keep sending to the old \
                 backend until the application reconnects"
            ),
        }
    }

    fn apply_node_facts(&mut self, desired: &DesiredState) -> Result<(), MapError> {
        let facts =
            node_facts(&self.settings, &desired.node).with_service_cidrs(&desired.service_cidrs);
        if self.applied.as_ref() == Some(&facts) {
            return Ok(());
        }
        let writes = self.node_programmer.apply(&facts, &mut self.maps)?;
        let stats = self.programmer.set_node_addresses(
            &facts.addresses,
            &facts.addresses6,
            desired,
            &mut self.maps,
        )?;
        info!(
            node_writes = writes,
            node_port_addresses = ?facts.addresses.node_ports,
            service_cidrs = ?facts.service_cidrs,
            external_interfaces = ?facts.external_interfaces.keys().collect::<Vec<_>>(),
            frontend_writes = stats.writes,
            "node facts applied"
        );
        self.applied = Some(facts);
        Ok(())
    }
}

/// Syncs hand the UDP flows to endpoints that no longer serve to a thread of their own:
/// finding them reads the whole conntrack table.
fn flush_in_background(maps: &mut KernelMaps) -> ConntrackReconcilerMetrics {
    let metrics = ConntrackReconcilerMetrics::new(&crate::model::IpFamily::BOTH);
    if let Err(e) = maps.flush_in_background(metrics.clone()) {
        warn!(
            error = %e,
            "cannot start the thread that flushes the UDP flows of endpoints that no longer serve: \
             syncs flush them themselves"
        );
    }
    metrics
}

fn fresh_programmer(maps: &KernelMaps, settings: &EbpfNodeSettings) -> Programmer {
    let mut programmer = Programmer::new();
    programmer.set_capacity(maps.capacity());
    programmer.set_maglev(settings.maglev);
    programmer
}

/// The share of the table in use, and whether that is nearly full.
fn fill_level(entries: usize, capacity: u32) -> (f64, bool) {
    let fill = entries as f64 / f64::from(capacity.max(1));
    (fill, fill >= FILL_WARNING)
}

impl Proxier for EbpfProxier {
    type Error = MapError;

    fn sync(&mut self, desired: &DesiredState, changes: &SyncChanges) -> Result<(), MapError> {
        let started = Instant::now();
        if self.adopting {
            self.adopt(desired)?;
        }
        self.apply_node_facts(desired)?;
        let batched = std::mem::take(&mut self.cold_start);
        if batched {
            self.maps.defer_writes();
        }
        let programmed = if changes.full {
            self.programmer.sync(desired, &mut self.maps)
        } else {
            self.programmer
                .sync_changed(desired, &changes.changed, &mut self.maps)
        };
        let written = programmed.and_then(|stats| Ok((stats, self.maps.write_deferred()?)));
        let (stats, batched_writes) = match written {
            Ok(done) => done,
            Err(error) => {
                if batched {
                    warn!(%error, "the first sync's batched writes failed: the next sync takes over what the maps hold");
                    self.start_over();
                }
                return Err(error);
            }
        };
        if batched {
            debug!(
                batched_writes,
                "first sync: frontends and backends written in batches"
            );
        }
        self.end_stale_udp_sockets();
        let took = started.elapsed();
        if let Some(programs) = self.programs.take() {
            programs.wait().map_err(MapError::ProgramsNotLoaded)?;
            info!(
                maps_written_in = ?took,
                attached_after = ?started.elapsed(),
                "first sync: the packet programs verified and attached"
            );
        }
        if !changes.full && changes.changed.is_empty() {
            debug!("datapath synced: no service changed");
        } else {
            info!(
                full = changes.full,
                changed = changes.changed.len(),
                frontends = stats.frontends,
                backends = stats.backends,
                writes = stats.writes,
                deletes = stats.deletes,
                udp_frontends_judged = stats.udp_frontends_judged,
                flushed_flows = stats.flushed_flows,
                took = ?took,
                "datapath synced"
            );
        }
        Ok(())
    }

    /// Bookkeeping once the sync is reported: neither delays a change, nor
    /// the first sync's report (the names took 40-60 ms at 50,000 services).
    fn after_sync(&mut self, desired: &DesiredState, changes: &SyncChanges) {
        self.conntrack_fill.check(&self.maps);
        self.publish_names(desired, changes);
    }
}

#[cfg(test)]
mod tests {
    use super::fill_level;

    #[test]
    fn the_conntrack_table_is_reported_nearly_full_from_ninety_percent() {
        assert_eq!(fill_level(0, 1024), (0.0, false));
        assert!(!fill_level(921, 1024).1);
        assert!(fill_level(922, 1024).1);
        assert!(fill_level(1024, 1024).1);
        assert_eq!(
            fill_level(5, 0).0,
            5.0,
            "a capacity of 0 cannot divide by zero"
        );
    }
}
