//! `inspect conntrack`: the flows of the conntrack table, filtered by
//! service, endpoint or client, and the clients, services and backends
//! holding the most entries (what fills a full table).

use std::{
    collections::{BTreeSet, HashMap},
    net::{IpAddr, SocketAddr},
};

use proxy_common::{CtDirection, CtKeyOf, CtValueOf, conntrack::flags};
use serde::Serialize;

use super::{
    args::EndpointFilter,
    names::{NamesStatus, Naming},
    services::naming_line,
    table::Table,
};
use crate::modes::ebpf::{family::AgentFamily, publish::protocol_name};

/// One conntrack entry of either family, with its addresses as the packets carry them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub forward: bool,
    pub proto: u8,
    /// The key: the packet's source and destination.
    pub source: SocketAddr,
    pub destination: SocketAddr,
    /// Forward: the backend. Reply: the frontend restored as source.
    pub nat: SocketAddr,
    /// Forward: the masquerade source. Reply: the client restored as
    /// destination. `None` without source NAT.
    pub snat: Option<SocketAddr>,
    pub flags: u16,
    pub service_id: u32,
    pub backend_id: u32,
    pub last_seen_ns: u64,
    pub created_ns: u64,
}

impl Flow {
    pub fn of<F: AgentFamily>(k: &CtKeyOf<F>, v: &CtValueOf<F>) -> Flow {
        let at = |addr: F::Addr, port_be: u16| {
            SocketAddr::new(F::from_be(addr).into(), u16::from_be(port_be))
        };
        Flow {
            forward: v.direction() == CtDirection::Forward,
            proto: k.proto,
            source: at(k.saddr_be, k.sport_be),
            destination: at(k.daddr_be, k.dport_be),
            nat: at(v.nat_addr_be, v.nat_port_be),
            snat: (v.snat_addr_be != F::Addr::default())
                .then(|| at(v.snat_addr_be, v.snat_port_be)),
            flags: v.flags,
            service_id: v.service_id,
            backend_id: v.backend_id,
            last_seen_ns: v.last_seen_ns,
            created_ns: v.created_ns,
        }
    }
}

/// What to keep.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub service_ids: Option<BTreeSet<u32>>,
    pub endpoint: Option<EndpointFilter>,
    pub client: Option<IpAddr>,
}

/// One entry, in the client's and backend's terms whichever its direction.
#[derive(Clone, Debug, Serialize)]
pub struct EntryView {
    /// `forward` (keyed by the client's packets) or `reply` (by the backend's).
    pub direction: &'static str,
    pub protocol: &'static str,
    /// The key: the packet's source and destination.
    pub source: String,
    pub destination: String,
    pub client: String,
    pub backend: String,
    pub service_id: u32,
    pub service: Option<String>,
    pub backend_id: u32,
    /// The masquerade address and port, when source-NATed.
    pub snat: Option<String>,
    /// `seen_reply`, `closing`, `fin_forward`, `fin_reply`, `rst`.
    pub flags: Vec<&'static str>,
    /// Seconds since the last packet in this direction.
    pub idle_seconds: f64,
    pub age_seconds: f64,
}

/// A client, service or backend and its entries.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Heavy {
    pub key: String,
    pub entries: u64,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct Top {
    pub clients: Vec<Heavy>,
    pub services: Vec<Heavy>,
    pub backends: Vec<Heavy>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ConntrackReport {
    pub names: NamesStatus,
    /// Entries in the table.
    pub total: u64,
    pub capacity: u32,
    /// Entries the filters kept.
    pub matched: u64,
    /// Entries listed (at most --limit).
    pub entries: Vec<EntryView>,
    /// With --top.
    pub top: Option<Top>,
    /// What the datapath's collector did (absent when its map is not pinned).
    pub collector: Option<CollectorView>,
}

/// The conntrack collector's counts (`proxy_common::collector`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CollectorView {
    pub sweeps: u64,
    pub removed_expired: u64,
    pub removed_unanswered_under_pressure: u64,
    /// How long ago the last sweep started, and how long it held its CPU.
    pub last_sweep_seconds_ago: Option<f64>,
    pub last_sweep_took_ms: Option<f64>,
}

impl CollectorView {
    pub fn of(stats: &proxy_common::collector::CollectorStats, now_ns: u64) -> Self {
        let swept = stats.sweeps > 0;
        CollectorView {
            sweeps: stats.sweeps,
            removed_expired: stats.removed - stats.removed_under_pressure,
            removed_unanswered_under_pressure: stats.removed_under_pressure,
            last_sweep_seconds_ago: swept
                .then(|| now_ns.saturating_sub(stats.last_sweep_ns) as f64 / 1e9),
            last_sweep_took_ms: swept.then(|| stats.last_sweep_took_ns as f64 / 1e6),
        }
    }

    fn text(&self) -> String {
        let last = match (self.last_sweep_seconds_ago, self.last_sweep_took_ms) {
            (Some(ago), Some(took)) => format!("last {ago:.0}s ago, took {took:.1} ms"),
            _ => "none yet".into(),
        };
        format!(
            "collector: {} sweeps ({last}); removed {} expired, {} unanswered under pressure\n",
            self.sweeps, self.removed_expired, self.removed_unanswered_under_pressure
        )
    }
}

/// The client and backend of an entry: the client sent the forward
/// direction; a reply is keyed by the backend's packet to the client, or to
/// the masquerade address (then the client is remembered in the value).
fn client_and_backend(f: &Flow) -> (SocketAddr, SocketAddr) {
    if f.forward {
        (f.source, f.nat)
    } else {
        (f.snat.unwrap_or(f.destination), f.source)
    }
}

impl Filter {
    pub fn keeps(&self, f: &Flow) -> bool {
        let (client, backend) = client_and_backend(f);
        self.service_ids
            .as_ref()
            .is_none_or(|ids| ids.contains(&f.service_id))
            && self.client.is_none_or(|c| c == client.ip())
            && self
                .endpoint
                .is_none_or(|e| e.matches(backend.ip(), backend.port()))
    }
}

pub struct Options<'a> {
    pub filter: &'a Filter,
    pub limit: usize,
    pub top: Option<u32>,
    pub capacity: u32,
    /// CLOCK_MONOTONIC now, in ns (the clock of `bpf_ktime_get_ns`).
    pub now_ns: u64,
}

pub fn report(
    entries: impl Iterator<Item = Flow>,
    naming: &Naming,
    opts: &Options<'_>,
) -> ConntrackReport {
    let (mut total, mut matched) = (0u64, 0u64);
    let mut shown = Vec::new();
    let mut clients: HashMap<IpAddr, u64> = HashMap::new();
    let mut services: HashMap<u32, u64> = HashMap::new();
    let mut backends: HashMap<SocketAddr, u64> = HashMap::new();
    for f in entries {
        total += 1;
        if !opts.filter.keeps(&f) {
            continue;
        }
        matched += 1;
        if opts.top.is_some() {
            let (client, backend) = client_and_backend(&f);
            *clients.entry(client.ip()).or_default() += 1;
            *services.entry(f.service_id).or_default() += 1;
            *backends.entry(backend).or_default() += 1;
        }
        if shown.len() < opts.limit {
            shown.push(view(&f, naming, opts.now_ns));
        }
    }
    shown.sort_by(|a: &EntryView, b| (&a.client, a.direction).cmp(&(&b.client, b.direction)));
    let top = opts.top.map(|n| Top {
        clients: heaviest(clients, n, |c| c.to_string()),
        services: heaviest(services, n, |id| service_name(naming, *id)),
        backends: heaviest(backends, n, |b| b.to_string()),
    });
    ConntrackReport {
        names: naming.status.clone(),
        total,
        capacity: opts.capacity,
        matched,
        entries: shown,
        top,
        collector: None,
    }
}

fn service_name(naming: &Naming, id: u32) -> String {
    naming
        .service(id)
        .map_or_else(|| format!("id {id}"), |s| s.port_name())
}

/// The `n` keys with the most entries, most first (ties by key).
pub fn heaviest<K>(counts: HashMap<K, u64>, n: u32, name: impl Fn(&K) -> String) -> Vec<Heavy> {
    let mut all: Vec<Heavy> = counts
        .iter()
        .map(|(k, entries)| Heavy {
            key: name(k),
            entries: *entries,
        })
        .collect();
    all.sort_by(|a, b| b.entries.cmp(&a.entries).then_with(|| a.key.cmp(&b.key)));
    all.truncate(n as usize);
    all
}

fn view(f: &Flow, naming: &Naming, now_ns: u64) -> EntryView {
    let (client, backend) = client_and_backend(f);
    let snat = f
        .snat
        .filter(|_| f.flags & flags::SNAT != 0 && f.forward)
        .map(|s| s.to_string());
    let names = [
        (flags::SEEN_REPLY, "seen_reply"),
        (flags::CLOSING, "closing"),
        (flags::FIN_FORWARD, "fin_forward"),
        (flags::FIN_REPLY, "fin_reply"),
        (flags::RST, "rst"),
        (flags::SNAT, "snat"),
    ];
    let seconds = |t: u64| now_ns.saturating_sub(t) as f64 / 1e9;
    EntryView {
        direction: if f.forward { "forward" } else { "reply" },
        protocol: protocol_name(f.proto),
        source: f.source.to_string(),
        destination: f.destination.to_string(),
        client: client.to_string(),
        backend: backend.to_string(),
        service_id: f.service_id,
        service: naming.service(f.service_id).map(|s| s.port_name()),
        backend_id: f.backend_id,
        snat,
        flags: names
            .iter()
            .filter(|(bit, _)| f.flags & bit != 0)
            .map(|(_, n)| *n)
            .collect(),
        idle_seconds: seconds(f.last_seen_ns),
        age_seconds: seconds(f.created_ns),
    }
}

impl ConntrackReport {
    pub fn text(&self) -> String {
        let mut out = naming_line(&self.names);
        out.push_str(&format!(
            "{} of {} entries match (capacity {}), {} listed\n",
            self.matched,
            self.total,
            self.capacity,
            self.entries.len()
        ));
        if let Some(collector) = &self.collector {
            out.push_str(&collector.text());
        }
        if !self.entries.is_empty() {
            let mut t = Table::new(&[
                "DIR", "PROTO", "CLIENT", "BACKEND", "SERVICE", "SNAT", "FLAGS", "IDLE",
            ]);
            for e in &self.entries {
                t.row(vec![
                    e.direction.into(),
                    e.protocol.into(),
                    e.client.clone(),
                    e.backend.clone(),
                    e.service
                        .clone()
                        .unwrap_or_else(|| format!("id {}", e.service_id)),
                    e.snat.clone().unwrap_or_else(|| "-".into()),
                    if e.flags.is_empty() {
                        "-".into()
                    } else {
                        e.flags.join(",")
                    },
                    format!("{:.0}s", e.idle_seconds),
                ]);
            }
            out.push_str(&t.render());
        }
        if let Some(top) = &self.top {
            for (title, list) in [
                ("CLIENT", &top.clients),
                ("SERVICE", &top.services),
                ("BACKEND", &top.backends),
            ] {
                let mut t = Table::new(&[title, "ENTRIES"]);
                for h in list {
                    t.row(vec![h.key.clone(), h.entries.to_string()]);
                }
                out.push('\n');
                out.push_str(&t.render());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use proxy_common::{CtKey, CtKey6, CtValue, CtValue6, V4, V6};

    use super::*;

    fn be(a: [u8; 4]) -> u32 {
        u32::from(Ipv4Addr::from(a)).to_be()
    }

    fn forward(client: [u8; 4], backend: [u8; 4], service_id: u32) -> Flow {
        let k = CtKey::new(
            be(client),
            be([198, 19, 0, 10]),
            40000u16.to_be(),
            80u16.to_be(),
            6,
        );
        let v = CtValue {
            nat_addr_be: be(backend),
            nat_port_be: 8080u16.to_be(),
            service_id,
            ..Default::default()
        };
        Flow::of::<V4>(&k, &v)
    }

    fn reply_masqueraded(client: [u8; 4], backend: [u8; 4]) -> Flow {
        let k = CtKey::new(
            be(backend),
            be([198, 18, 0, 1]),
            8080u16.to_be(),
            61000u16.to_be(),
            6,
        );
        let v = CtValue {
            snat_addr_be: be(client),
            snat_port_be: 40000u16.to_be(),
            flags: flags::REPLY,
            service_id: 1,
            ..Default::default()
        };
        Flow::of::<V4>(&k, &v)
    }

    #[test]
    fn the_collector_line_says_what_the_sweeps_removed() {
        use proxy_common::collector::CollectorStats;
        let none = CollectorView::of(&CollectorStats::default(), 5_000_000_000);
        assert_eq!(
            none.text(),
            "collector: 0 sweeps (none yet); removed 0 expired, 0 unanswered under pressure\n"
        );
        let stats = CollectorStats {
            sweeps: 3,
            removed: 10,
            removed_under_pressure: 4,
            last_sweep_ns: 2_000_000_000,
            last_sweep_took_ns: 1_250_000,
            ..CollectorStats::default()
        };
        let view = CollectorView::of(&stats, 9_000_000_000);
        assert_eq!(view.removed_expired, 6);
        assert_eq!(
            view.text(),
            "collector: 3 sweeps (last 7s ago, took 1.2 ms); removed 6 expired, 4 unanswered under pressure\n"
        );
    }

    #[test]
    fn both_directions_of_a_flow_belong_to_its_client_and_backend() {
        let flow = forward([198, 18, 0, 100], [198, 18, 2, 10], 1);
        assert_eq!(
            client_and_backend(&flow).0.ip(),
            Ipv4Addr::new(198, 18, 0, 100)
        );
        let flow = reply_masqueraded([198, 18, 0, 100], [198, 18, 2, 10]);
        let (client, backend) = client_and_backend(&flow);
        assert_eq!(client, "198.18.0.100:40000".parse().unwrap());
        assert_eq!(backend, "198.18.2.10:8080".parse().unwrap());
        let f = Filter {
            client: Some(Ipv4Addr::new(198, 18, 0, 100).into()),
            endpoint: Some(EndpointFilter {
                ip: Ipv4Addr::new(198, 18, 2, 10).into(),
                port: Some(8080),
            }),
            service_ids: Some(BTreeSet::from([1])),
        };
        assert!(f.keeps(&flow));
        let other = Filter {
            client: Some(Ipv4Addr::new(198, 18, 0, 101).into()),
            ..Default::default()
        };
        assert!(!other.keeps(&flow));
    }

    #[test]
    fn an_ipv6_reply_entry_names_its_client_and_backend() {
        let ip = |s: &str| V6::to_be(s.parse::<Ipv6Addr>().unwrap());
        let k = CtKey6::new(
            ip("2001:db8:2::10"),
            ip("2001:db8:100::1"),
            8080u16.to_be(),
            61000u16.to_be(),
            6,
        );
        let v = CtValue6 {
            snat_addr_be: ip("2001:db8:100::2"),
            snat_port_be: 40000u16.to_be(),
            flags: flags::SNAT | flags::REPLY,
            ..Default::default()
        };
        let (client, backend) = client_and_backend(&Flow::of::<V6>(&k, &v));
        assert_eq!(client, "[2001:db8:100::2]:40000".parse().unwrap());
        assert_eq!(backend, "[2001:db8:2::10]:8080".parse().unwrap());
    }

    #[test]
    fn the_heaviest_come_first_and_ties_by_name() {
        let counts = HashMap::from([("b", 2u64), ("a", 2), ("c", 5), ("d", 1)]);
        let top = heaviest(counts, 3, |k| k.to_string());
        let keys: Vec<_> = top.iter().map(|h| (h.key.as_str(), h.entries)).collect();
        assert_eq!(keys, [("c", 5), ("a", 2), ("b", 2)]);
    }
}
