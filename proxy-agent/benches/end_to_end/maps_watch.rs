//! Watching an agent's BPF maps from outside it: when does a frontend's
//! backend set hold a given endpoint. The endpoint-change figure "to the
//! maps" is timed with it, on the node, from the moment the bench's worker
//! moves the changed EndpointSlice into place.
//!
//! The maps are found by the agent's pid (its open map fds name their ids in
//! `/proc/<pid>/fdinfo`), not by their pins: in a testbed every
//! `ip netns exec` mounts a sysfs of its own, so the agent's bpffs is not
//! visible to the worker.

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use aya::maps::{Array, HashMap, Map, MapData};
use proxy_common::{
    Backend, BackendId, ServiceKey, ServiceValue, maps as names, proto, slots, slots::SlotPair,
};

/// The IPv4 maps a frontend's backends are read from.
pub struct AgentMaps {
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    slots: Array<MapData, SlotPair>,
    backends: HashMap<MapData, BackendId, Backend>,
}

impl AgentMaps {
    /// The maps the process `pid` holds open.
    pub fn of_process(pid: u32) -> anyhow::Result<Self> {
        let fdinfo = format!("/proc/{pid}/fdinfo");
        let mut found: [Option<MapData>; 3] = [None, None, None];
        for entry in std::fs::read_dir(&fdinfo).with_context(|| format!("reading {fdinfo}"))? {
            let Ok(text) = std::fs::read_to_string(entry?.path()) else {
                continue; // a descriptor closed meanwhile
            };
            let Some(id) = text
                .lines()
                .find_map(|l| l.strip_prefix("map_id:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
            else {
                continue;
            };
            let data = MapData::from_id(id).with_context(|| format!("opening map id {id}"))?;
            let name = data.info()?.name_as_str().unwrap_or_default().to_owned();
            let slot = [names::SERVICES, names::SLOTS, names::BACKENDS]
                .iter()
                .position(|n| *n == name);
            if let Some(i) = slot {
                found[i] = Some(data);
            }
        }
        let [Some(services), Some(slots), Some(backends)] = found else {
            bail!("process {pid} holds no SERVICES, SLOTS and BACKENDS maps open");
        };
        let map = |data: MapData| Map::from_map_data(data).context("reading a map's type");
        Ok(Self {
            services: HashMap::try_from(map(services)?)?,
            slots: Array::try_from(map(slots)?)?,
            backends: HashMap::try_from(map(backends)?)?,
        })
    }

    /// Whether the TCP frontend `frontend` balances to `backend` alone now:
    /// every slot of its set names it (a set being rewritten may show the
    /// new backend in one slot while the old ones still fill the others).
    pub fn serves_only(
        &self,
        frontend: SocketAddrV4,
        backend: SocketAddrV4,
    ) -> anyhow::Result<bool> {
        let key = ServiceKey::frontend(
            u32::from(*frontend.ip()).to_be(),
            frontend.port().to_be(),
            proto::TCP,
        );
        let Ok(set) = self.services.get(&key, 0) else {
            return Ok(false);
        };
        if set.count == 0 {
            return Ok(false);
        }
        for slot in 1..=set.count {
            let (element, at) = slots::locate(set.slot_index(slot));
            let id = self.slots.get(&element, 0)?.ids[at];
            let Ok(b) = self.backends.get(&id, 0) else {
                return Ok(false);
            };
            if Ipv4Addr::from(u32::from_be(b.addr_be)) != *backend.ip()
                || u16::from_be(b.port_be) != backend.port()
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Polls (every 100 µs) until `frontend` balances to `backend` alone:
    /// how long after `since` that was first seen. The polling thread runs
    /// at real-time priority meanwhile (where it may), so that the figure is
    /// when the agent wrote the maps, not when a busy node next scheduled
    /// the observer.
    pub fn wait_serving_only(
        &self,
        frontend: SocketAddrV4,
        backend: SocketAddrV4,
        since: Instant,
        limit: Duration,
    ) -> anyhow::Result<Duration> {
        let _realtime = RealTime::enter();
        loop {
            if self.serves_only(frontend, backend)? {
                return Ok(since.elapsed());
            }
            if since.elapsed() > limit {
                bail!("{frontend} did not balance to {backend} alone within {limit:?}");
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// This thread under SCHED_FIFO until dropped (left as it is when that is
/// not allowed).
struct RealTime(Option<(libc::c_int, libc::sched_param)>);

impl RealTime {
    fn enter() -> Self {
        // SAFETY: pid 0 is the calling thread; the params are valid.
        unsafe {
            let policy = libc::sched_getscheduler(0);
            let mut before = libc::sched_param { sched_priority: 0 };
            let fifo = libc::sched_param { sched_priority: 50 };
            if policy < 0
                || libc::sched_getparam(0, &mut before) != 0
                || libc::sched_setscheduler(0, libc::SCHED_FIFO, &fifo) != 0
            {
                return Self(None);
            }
            Self(Some((policy, before)))
        }
    }
}

impl Drop for RealTime {
    fn drop(&mut self) {
        if let Some((policy, param)) = self.0 {
            // SAFETY: restores this thread's own earlier policy.
            unsafe { libc::sched_setscheduler(0, policy, &param) };
        }
    }
}

/// `addr` as IPv4, the only family the bench's services use.
pub fn v4(addr: SocketAddr) -> anyhow::Result<SocketAddrV4> {
    match addr {
        SocketAddr::V4(a) => Ok(a),
        SocketAddr::V6(a) => bail!("{a}: the bench's services are IPv4"),
    }
}
