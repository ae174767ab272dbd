//! `inspect conntrack`: the flows of the conntrack table, filtered by
//! service, endpoint or client, and the clients, services and backends
//! holding the most entries (what fills a full table).

use std::{
    collections::{BTreeSet, HashMap},
    net::Ipv4Addr,
};

use proxy_common::{CtDirection, CtKey, CtValue, conntrack::flags};
use serde::Serialize;

use super::{
    args::EndpointFilter,
    names::{NamesStatus, Naming},
    services::naming_line,
    table::Table,
};
use crate::modes::ebpf::publish::protocol_name;

/// What to keep.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub service_ids: Option<BTreeSet<u32>>,
    pub endpoint: Option<EndpointFilter>,
    pub client: Option<Ipv4Addr>,
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
}

/// The client and backend of an entry: the client sent the forward
/// direction; a reply is keyed by the backend's packet to the client, or to
/// the masquerade address (then the client is remembered in the value).
fn client_and_backend(k: &CtKey, v: &CtValue) -> ((Ipv4Addr, u16), (Ipv4Addr, u16)) {
    if k.direction == CtDirection::Forward as u8 {
        (
            (ip(k.saddr_be), u16::from_be(k.sport_be)),
            (ip(v.nat_addr_be), u16::from_be(v.nat_port_be)),
        )
    } else {
        let client = if v.snat_addr_be != 0 {
            (ip(v.snat_addr_be), u16::from_be(v.snat_port_be))
        } else {
            (ip(k.daddr_be), u16::from_be(k.dport_be))
        };
        (client, (ip(k.saddr_be), u16::from_be(k.sport_be)))
    }
}

impl Filter {
    pub fn keeps(&self, k: &CtKey, v: &CtValue) -> bool {
        let (client, backend) = client_and_backend(k, v);
        self.service_ids
            .as_ref()
            .is_none_or(|ids| ids.contains(&v.service_id))
            && self.client.is_none_or(|c| c == client.0)
            && self
                .endpoint
                .is_none_or(|e| e.matches(backend.0, backend.1))
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
    entries: impl Iterator<Item = (CtKey, CtValue)>,
    naming: &Naming,
    opts: &Options<'_>,
) -> ConntrackReport {
    let (mut total, mut matched) = (0u64, 0u64);
    let mut shown = Vec::new();
    let mut clients: HashMap<Ipv4Addr, u64> = HashMap::new();
    let mut services: HashMap<u32, u64> = HashMap::new();
    let mut backends: HashMap<(Ipv4Addr, u16), u64> = HashMap::new();
    for (k, v) in entries {
        total += 1;
        if !opts.filter.keeps(&k, &v) {
            continue;
        }
        matched += 1;
        if opts.top.is_some() {
            let (client, backend) = client_and_backend(&k, &v);
            *clients.entry(client.0).or_default() += 1;
            *services.entry(v.service_id).or_default() += 1;
            *backends.entry(backend).or_default() += 1;
        }
        if shown.len() < opts.limit {
            shown.push(view(&k, &v, naming, opts.now_ns));
        }
    }
    shown.sort_by(|a: &EntryView, b| (&a.client, a.direction).cmp(&(&b.client, b.direction)));
    let top = opts.top.map(|n| Top {
        clients: heaviest(clients, n, |c| c.to_string()),
        services: heaviest(services, n, |id| service_name(naming, *id)),
        backends: heaviest(backends, n, |(a, p)| format!("{a}:{p}")),
    });
    ConntrackReport {
        names: naming.status.clone(),
        total,
        capacity: opts.capacity,
        matched,
        entries: shown,
        top,
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

fn view(k: &CtKey, v: &CtValue, naming: &Naming, now_ns: u64) -> EntryView {
    let (client, backend) = client_and_backend(k, v);
    let forward = k.direction == CtDirection::Forward as u8;
    let snat = (v.flags & flags::SNAT != 0 && v.snat_addr_be != 0 && forward)
        .then(|| format!("{}:{}", ip(v.snat_addr_be), u16::from_be(v.snat_port_be)));
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
        direction: if forward { "forward" } else { "reply" },
        protocol: protocol_name(k.proto),
        source: format!("{}:{}", ip(k.saddr_be), u16::from_be(k.sport_be)),
        destination: format!("{}:{}", ip(k.daddr_be), u16::from_be(k.dport_be)),
        client: format!("{}:{}", client.0, client.1),
        backend: format!("{}:{}", backend.0, backend.1),
        service_id: v.service_id,
        service: naming.service(v.service_id).map(|s| s.port_name()),
        backend_id: v.backend_id,
        snat,
        flags: names
            .iter()
            .filter(|(bit, _)| v.flags & bit != 0)
            .map(|(_, n)| *n)
            .collect(),
        idle_seconds: seconds(v.last_seen_ns),
        age_seconds: seconds(v.created_ns),
    }
}

/// CLOCK_MONOTONIC in ns.
pub fn monotonic_now_ns() -> u64 {
    // SAFETY: a zeroed timespec is valid output space for clock_gettime.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` lives across the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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

fn ip(addr_be: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from_be(addr_be))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn be(a: [u8; 4]) -> u32 {
        u32::from(Ipv4Addr::from(a)).to_be()
    }

    fn forward(client: [u8; 4], backend: [u8; 4], service_id: u32) -> (CtKey, CtValue) {
        let k = CtKey::new(
            be(client),
            be([198, 19, 0, 10]),
            40000u16.to_be(),
            80u16.to_be(),
            6,
            CtDirection::Forward,
        );
        let v = CtValue {
            nat_addr_be: be(backend),
            nat_port_be: 8080u16.to_be(),
            service_id,
            ..Default::default()
        };
        (k, v)
    }

    fn reply_masqueraded(client: [u8; 4], backend: [u8; 4]) -> (CtKey, CtValue) {
        let k = CtKey::new(
            be(backend),
            be([198, 18, 0, 1]),
            8080u16.to_be(),
            61000u16.to_be(),
            6,
            CtDirection::Reply,
        );
        let v = CtValue {
            snat_addr_be: be(client),
            snat_port_be: 40000u16.to_be(),
            service_id: 1,
            ..Default::default()
        };
        (k, v)
    }

    #[test]
    fn both_directions_of_a_flow_belong_to_its_client_and_backend() {
        let (k, v) = forward([198, 18, 0, 100], [198, 18, 2, 10], 1);
        assert_eq!(
            client_and_backend(&k, &v).0.0,
            Ipv4Addr::new(198, 18, 0, 100)
        );
        let (k, v) = reply_masqueraded([198, 18, 0, 100], [198, 18, 2, 10]);
        let (client, backend) = client_and_backend(&k, &v);
        assert_eq!(client, (Ipv4Addr::new(198, 18, 0, 100), 40000));
        assert_eq!(backend, (Ipv4Addr::new(198, 18, 2, 10), 8080));
        let f = Filter {
            client: Some(Ipv4Addr::new(198, 18, 0, 100)),
            endpoint: Some(EndpointFilter {
                ip: Ipv4Addr::new(198, 18, 2, 10).into(),
                port: Some(8080),
            }),
            service_ids: Some(BTreeSet::from([1])),
        };
        assert!(f.keeps(&k, &v));
        let other = Filter {
            client: Some(Ipv4Addr::new(198, 18, 0, 101)),
            ..Default::default()
        };
        assert!(!other.keeps(&k, &v));
    }

    #[test]
    fn the_heaviest_come_first_and_ties_by_name() {
        let counts = HashMap::from([("b", 2u64), ("a", 2), ("c", 5), ("d", 1)]);
        let top = heaviest(counts, 3, |k| k.to_string());
        let keys: Vec<_> = top.iter().map(|h| (h.key.as_str(), h.entries)).collect();
        assert_eq!(keys, [("c", 5), ("a", 2), ("b", 2)]);
    }
}
