//! Katran's XDP balancer as a peer in the same run (issue 14): its public
//! BPF source, built here with clang when `KATRAN_SRC` names a checkout of
//! facebookincubator/katran (nothing of it is vendored), loaded with aya and
//! its maps filled for the same kind of VIP the floor and our NodePort path
//! serve: one TCP VIP of three reals, the gateway MAC in `ctl_array`.
//! Its flow table is set up as Katran's user space (`KatranLb`) sets it up
//! in production: one LRU map per forwarding CPU in `lru_mapping`, each of
//! the total flow capacity divided by the CPUs, here the flows our conntrack
//! map holds (two entries per flow). Without them it would fall back to its
//! `fallback_cache` of 1,000 flows, which Katran's source says is for unit
//! tests, and which stays in the CPU's caches where a production table does not.
//!
//! Packets: a flow whose LRU entry exists (established: IPIP encapsulation,
//! XDP_TX), new flows (consistent-hash ring, LRU insert), and a packet that
//! is for no VIP (XDP_PASS). An encapsulated packet cannot be run again, so
//! only one run per call (r=1), as for our XDP path.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail, ensure};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, ArrayOfMaps, HashMap, Map, MapData},
    programs::Xdp,
};

const PROGRAM: &str = "balancer_ingress";
/// balancer_consts.h.
const RING_SIZE: u32 = 65_537;
/// `struct flow_key` and `struct real_pos_lru` (balancer_structs.h), the
/// per-CPU LRU's key and value.
const FLOW_KEY_SIZE: u32 = 40;
const REAL_POS_LRU_SIZE: u32 = 16;
const REALS: u32 = 3;

#[repr(C)]
#[derive(Clone, Copy)]
struct VipDefinition {
    addr_be: [u32; 4],
    port_be: u16,
    proto: u8,
    _pad: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct VipMeta {
    flags: u32,
    vip_num: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct RealDefinition {
    addr_be: [u32; 4],
    flags: u8,
    _pad: [u8; 3],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CtlValue {
    value: u64,
}

// SAFETY: plain #[repr(C)] data with explicit padding, as Katran's headers lay them out.
unsafe impl aya::Pod for VipDefinition {}
// SAFETY: as above.
unsafe impl aya::Pod for VipMeta {}
// SAFETY: as above.
unsafe impl aya::Pod for RealDefinition {}
// SAFETY: as above.
unsafe impl aya::Pod for CtlValue {}

pub struct Katran {
    ebpf: Ebpf,
    /// Each CPU's LRU.
    lrus: Vec<Map>,
}

/// Builds Katran's balancer from `KATRAN_SRC`, or says why it is not measured.
pub fn from_env(work: &Path) -> Result<PathBuf, String> {
    let Ok(src) = std::env::var("KATRAN_SRC") else {
        return Err(
            "not measured: set KATRAN_SRC to a checkout of facebookincubator/katran \
                    (and have clang and llc; see docs/bench/README.md)"
                .into(),
        );
    };
    build(Path::new(&src), work).map_err(|e| format!("not measured: {e:#}"))
}

/// clang to LLVM IR for the host, llc to BPF: Katran's own recipe
/// (katran/lib/Makefile-bpf), which keeps the host's C headers usable.
fn build(src: &Path, work: &Path) -> anyhow::Result<PathBuf> {
    let source = src.join("katran/lib/bpf/balancer.bpf.c");
    ensure!(source.exists(), "{} is missing", source.display());
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let llc = std::env::var("LLC").unwrap_or_else(|_| "llc".into());
    let ir = work.join("balancer.ll");
    let object = work.join("balancer.bpf.o");
    let status = Command::new(&clang)
        .arg(format!("-I{}", src.display()))
        .args(["-D__KERNEL__", "-Wno-unused-value", "-Wno-pointer-sign"])
        .args([
            "-Wno-compare-distinct-pointer-types",
            "-O2",
            "-g",
            "-emit-llvm",
            "-S",
            "-c",
        ])
        .arg(&source)
        .arg("-o")
        .arg(&ir)
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("running {clang} (CLANG)"))?;
    ensure!(status.success(), "{clang} failed on {}", source.display());
    let status = Command::new(&llc)
        .args(["-march=bpf", "-filetype=obj", "-o"])
        .arg(&object)
        .arg(&ir)
        .status()
        .with_context(|| format!("running {llc} (LLC)"))?;
    ensure!(status.success(), "{llc} failed");
    Ok(object)
}

impl Katran {
    /// Loads the object and fills its maps: `vip` (TCP) balanced over
    /// `reals`, packets sent to `gateway_mac`, room for `flows` flows over
    /// the per-CPU LRUs.
    pub fn load(
        object: &Path,
        vip: (Ipv4Addr, u16),
        reals: [Ipv4Addr; REALS as usize],
        gateway_mac: [u8; 6],
        flows: u32,
    ) -> anyhow::Result<Self> {
        let bytes = std::fs::read(object)?;
        let mut ebpf = EbpfLoader::new()
            .load(&bytes)
            .context("loading Katran's object")?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .with_context(|| format!("{PROGRAM} missing"))?
            .try_into()?;
        prog.load()
            .context("loading Katran's program (the verifier)")?;

        let mut vips: HashMap<_, VipDefinition, VipMeta> =
            HashMap::try_from(ebpf.map_mut("vip_map").context("vip_map")?)?;
        let key = VipDefinition {
            addr_be: [u32::from(vip.0).to_be(), 0, 0, 0],
            port_be: vip.1.to_be(),
            proto: proxy_common::proto::TCP,
            _pad: 0,
        };
        vips.insert(
            key,
            VipMeta {
                flags: 0,
                vip_num: 0,
            },
            0,
        )?;

        let mut real_map: Array<_, RealDefinition> =
            Array::try_from(ebpf.map_mut("reals").context("reals")?)?;
        // Katran's real index 0 means "none": reals from 1.
        for (i, ip) in reals.iter().enumerate() {
            let real = RealDefinition {
                addr_be: [u32::from(*ip).to_be(), 0, 0, 0],
                flags: 0,
                _pad: [0; 3],
            };
            real_map.set(i as u32 + 1, real, 0)?;
        }
        let mut ring: Array<_, u32> =
            Array::try_from(ebpf.map_mut("ch_rings").context("ch_rings")?)?;
        // VIP 0's ring: the reals in turn (a consistent-hash ring's shares).
        for pos in 0..RING_SIZE {
            ring.set(pos, pos % REALS + 1, 0)?;
        }
        let mut ctl: Array<_, CtlValue> =
            Array::try_from(ebpf.map_mut("ctl_array").context("ctl_array")?)?;
        let mut mac = [0u8; 8];
        mac[..6].copy_from_slice(&gateway_mac);
        ctl.set(
            0,
            CtlValue {
                value: u64::from_ne_bytes(mac),
            },
            0,
        )?;
        let lrus = per_cpu_lrus(&mut ebpf, flows)?;
        Ok(Self { ebpf, lrus })
    }

    /// The flows its per-CPU LRUs hold, all CPUs together.
    pub fn per_cpu_flows(&self) -> anyhow::Result<usize> {
        let mut flows = 0;
        for lru in &self.lrus {
            let lru: HashMap<_, [u8; FLOW_KEY_SIZE as usize], [u8; REAL_POS_LRU_SIZE as usize]> =
                HashMap::try_from(lru)?;
            flows += lru.keys().count();
        }
        Ok(flows)
    }

    pub fn program(&self) -> anyhow::Result<&Xdp> {
        let prog = self.ebpf.program(PROGRAM).context("Katran's program")?;
        Ok(prog.try_into()?)
    }
}

/// The machine's CPUs (not this pinned process's share, which
/// `available_parallelism` counts): Katran's forwarding cores.
pub fn online_cpus() -> u32 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32
}

/// `KatranLb::initLrus` and `attachLrus`: an LRU of `flows` / CPUs entries
/// for every CPU, set in `lru_mapping` at the CPU's number.
fn per_cpu_lrus(ebpf: &mut Ebpf, flows: u32) -> anyhow::Result<Vec<Map>> {
    let cpus = online_cpus();
    let per_cpu = (flows / cpus).max(1);
    let mut mapping: ArrayOfMaps<_, MapData> =
        ArrayOfMaps::try_from(ebpf.map_mut("lru_mapping").context("lru_mapping")?)?;
    let mut lrus = Vec::new();
    for cpu in 0..cpus {
        let params = aya_obj::Map::new_from_params(
            aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_LRU_HASH as u32,
            FLOW_KEY_SIZE,
            REAL_POS_LRU_SIZE,
            per_cpu,
            0,
        );
        let lru = MapData::create(params, &format!("katran_lru{cpu}"), None)
            .with_context(|| format!("creating Katran's LRU for CPU {cpu}"))?;
        mapping
            .set(cpu, &lru, 0)
            .with_context(|| format!("setting lru_mapping[{cpu}]"))?;
        lrus.push(Map::LruHashMap(lru));
    }
    Ok(lrus)
}

/// Checks that Katran sent `out` (the result of a VIP packet) as an IPIP
/// packet to one of `reals`.
pub fn check_encapsulated(out: &[u8], reals: &[Ipv4Addr]) -> anyhow::Result<()> {
    const ETH: usize = 14;
    if out.len() < ETH + 40 || out[ETH + 9] != 4 {
        bail!("Katran's output is not IPIP");
    }
    let outer_dst = Ipv4Addr::new(out[ETH + 16], out[ETH + 17], out[ETH + 18], out[ETH + 19]);
    ensure!(reals.contains(&outer_dst), "Katran sent it to {outer_dst}");
    Ok(())
}
