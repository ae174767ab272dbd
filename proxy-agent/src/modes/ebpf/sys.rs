//! The few bpf(2) commands aya does not expose: reading and writing a map's
//! entries in batches, walking the kernel's links with their attach
//! details, asking which programs are attached to an interface through tcx,
//! and a test run by program fd alone (aya's needs the program object).

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_GET_NEXT_ID: libc::c_long = 31;

/// The kernel's own "operation not supported" (not EOPNOTSUPP), for map
/// types without batch operations.
const ENOTSUPP: i32 = 524;

/// `enum bpf_attach_type` values inspect names.
pub const BPF_TCX_INGRESS: u32 = 46;
pub const BPF_TCX_EGRESS: u32 = 47;
/// `enum bpf_link_type`: a cgroup link.
pub const BPF_LINK_TYPE_CGROUP: u32 = 3;

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialised `repr(C)` bpf_attr variant of
    // the size passed; the kernel reads and writes only within it (and the
    // buffers its pointers name, which the callers keep alive).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// Runs the program `fd` once on `data` (BPF_PROG_TEST_RUN, nothing
/// written back) on the calling thread's CPU; its return value.
pub fn test_run(fd: BorrowedFd<'_>, data: &[u8]) -> io::Result<u32> {
    let mut attr = TestRunAttr {
        prog_fd: fd.as_raw_fd() as u32,
        data_size_in: data.len() as u32,
        data_in: data.as_ptr() as u64,
        repeat: 1,
        ..Default::default()
    };
    bpf(BPF_PROG_TEST_RUN, &mut attr)?;
    Ok(attr.retval)
}

/// Entries per batch: 1M entries take 256 calls.
const BATCH: u32 = 4096;

/// The number of entries of a hash map, read in batches of keys and values
/// (BPF_MAP_LOOKUP_BATCH, Linux 5.6). `value_size` is the size the kernel
/// copies per entry (per-CPU maps: rounded up to 8, times the possible CPUs).
/// `Unsupported` when the map type has no batch lookup.
pub fn count_by_batches(fd: BorrowedFd<'_>, key_size: usize, value_size: usize) -> io::Result<u64> {
    let mut total = 0u64;
    walk_batches(fd, key_size, value_size, |keys, _| {
        total += (keys.len() / key_size.max(1)) as u64;
    })?;
    Ok(total)
}

/// Every entry of a hash map, handed to `batch` a batch at a time as its
/// keys and values (`key_size` and `value_size` bytes each, back to back):
/// a call per 4,096 entries instead of two per entry. `Unsupported` when
/// the map type has no batch lookup (BPF_MAP_LOOKUP_BATCH, Linux 5.6).
pub fn walk_batches(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    mut batch: impl FnMut(&[u8], &[u8]),
) -> io::Result<()> {
    let mut count = BATCH as usize;
    let mut keys = vec![0u8; count * key_size];
    let mut values = vec![0u8; count * value_size];
    // The hash maps' batch token is a bucket index; key-sized is always enough.
    let token_len = key_size.max(8);
    let (mut token_in, mut token_out) = (vec![0u8; token_len], vec![0u8; token_len]);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                token_in.as_mut_ptr() as u64
            },
            out_batch: token_out.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: count as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        let result = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let got = attr.count as usize;
        let last = matches!(&result, Err(e) if e.raw_os_error() == Some(libc::ENOENT));
        if got > 0 && (result.is_ok() || last) {
            batch(&keys[..got * key_size], &values[..got * value_size]);
        }
        match result {
            Ok(_) => {}
            // The walk is over; `count` holds the last entries.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            // One bucket holds more entries than fit: retry it with room for them.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && attr.count == 0 => {
                count *= 2;
                keys.resize(count * key_size, 0);
                values.resize(count * value_size, 0);
                continue;
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP)
                ) =>
            {
                return Err(io::Error::new(io::ErrorKind::Unsupported, e));
            }
            Err(e) => return Err(e),
        }
        std::mem::swap(&mut token_in, &mut token_out);
        first = false;
    }
}

/// [`walk_batches`] over a hash map of `K` to `V`: each batch handed to
/// `batch` as its entries, decoded.
pub fn walk_typed_batches<K: aya::Pod, V: aya::Pod>(
    fd: BorrowedFd<'_>,
    mut batch: impl FnMut(&mut dyn Iterator<Item = (K, V)>),
) -> io::Result<()> {
    let (key_size, value_size) = (size_of::<K>(), size_of::<V>());
    walk_batches(fd, key_size, value_size, |keys, values| {
        let mut entries = keys
            .chunks_exact(key_size)
            .zip(values.chunks_exact(value_size))
            .map(|(k, v)| {
                // SAFETY: the kernel wrote whole keys and values of these Pod
                // types; read_unaligned copes with the buffer's alignment.
                unsafe {
                    (
                        std::ptr::read_unaligned(k.as_ptr().cast::<K>()),
                        std::ptr::read_unaligned(v.as_ptr().cast::<V>()),
                    )
                }
            });
        batch(&mut entries);
    })
}

/// Writes `count` entries whose keys and values lie back to back at `keys`
/// and `values` (`key_size` and `value_size` bytes each), a call per 4,096
/// entries instead of one per entry (BPF_MAP_UPDATE_BATCH, Linux 5.6).
/// `Unsupported` when the map type has no batch update (nothing written).
pub fn update_batches(
    fd: BorrowedFd<'_>,
    (keys, key_size): (&[u8], usize),
    (values, value_size): (&[u8], usize),
) -> io::Result<()> {
    let count = keys.len() / key_size.max(1);
    if keys.len() != count * key_size || values.len() != count * value_size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "keys and values of different counts",
        ));
    }
    for start in (0..count).step_by(BATCH as usize) {
        let n = (count - start).min(BATCH as usize);
        let mut attr = BatchAttr {
            keys: keys[start * key_size..].as_ptr() as u64,
            values: values[start * value_size..].as_ptr() as u64,
            count: n as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        match bpf(BPF_MAP_UPDATE_BATCH, &mut attr) {
            Ok(_) => {}
            Err(e)
                if start == 0
                    && attr.count == 0
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP)
                    ) =>
            {
                return Err(io::Error::new(io::ErrorKind::Unsupported, e));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

const BPF_NOEXIST: u64 = 1;

fn elem(
    cmd: libc::c_long,
    fd: BorrowedFd<'_>,
    key: &[u8],
    value: *mut u8,
    flags: u64,
) -> io::Result<bool> {
    let mut attr = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        key: key.as_ptr() as u64,
        value: value as u64,
        flags,
        ..Default::default()
    };
    match bpf(cmd, &mut attr) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads the value of `key` into `value` (its map's value size); false
/// when there is no such key.
pub fn lookup(fd: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    elem(BPF_MAP_LOOKUP_ELEM, fd, key, value.as_mut_ptr(), 0)
}

/// Deletes `key` and hands back the value it had, in one step
/// (BPF_MAP_LOOKUP_AND_DELETE_ELEM, hash maps since Linux 5.14); false when
/// there was no such key.
pub fn take(fd: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    elem(
        BPF_MAP_LOOKUP_AND_DELETE_ELEM,
        fd,
        key,
        value.as_mut_ptr(),
        0,
    )
}

/// Inserts `key` unless the map holds it already; false when it did.
pub fn insert_new(fd: BorrowedFd<'_>, key: &[u8], value: &[u8]) -> io::Result<bool> {
    match elem(
        BPF_MAP_UPDATE_ELEM,
        fd,
        key,
        value.as_ptr().cast_mut(),
        BPF_NOEXIST,
    ) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        other => other,
    }
}

#[repr(C)]
#[derive(Default)]
struct NextKeyAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    next_key: u64,
}

/// The number of keys of any map that has keys, walked one by one
/// (BPF_MAP_GET_NEXT_KEY): for the maps without batch lookup (LPM tries).
pub fn count_by_keys(fd: BorrowedFd<'_>, key_size: usize) -> io::Result<u64> {
    let (mut key, mut next) = (vec![0u8; key_size], vec![0u8; key_size]);
    let mut total = 0u64;
    let mut first = true;
    loop {
        let mut attr = NextKeyAttr {
            map_fd: fd.as_raw_fd() as u32,
            key: if first { 0 } else { key.as_mut_ptr() as u64 },
            next_key: next.as_mut_ptr() as u64,
            ..Default::default()
        };
        match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
            Ok(_) => total += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(total),
            Err(e) => return Err(e),
        }
        std::mem::swap(&mut key, &mut next);
        first = false;
    }
}

#[repr(C)]
#[derive(Default)]
struct IdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `struct bpf_link_info` up to the parts inspect reads: the common head,
/// then the per-type union (8-byte aligned).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkInfo {
    pub link_type: u32,
    pub id: u32,
    pub prog_id: u32,
    _pad: u32,
    /// Cgroup links: the cgroup id (the cgroup v2 directory's inode).
    /// tcx and XDP links: the ifindex in the low half.
    pub union_head: u64,
    /// Cgroup links: the attach type in the low half.
    pub union_next: u64,
    _rest: [u64; 6],
}

impl LinkInfo {
    pub fn cgroup_id(&self) -> u64 {
        self.union_head
    }

    pub fn cgroup_attach_type(&self) -> u32 {
        self.union_next as u32
    }
}

/// Every link the kernel holds, with its info. Links that vanish during the
/// walk are skipped.
pub fn links() -> io::Result<Vec<LinkInfo>> {
    let mut out = Vec::new();
    let mut id = 0;
    loop {
        let mut attr = IdAttr {
            id,
            ..Default::default()
        };
        match bpf(BPF_LINK_GET_NEXT_ID, &mut attr) {
            Ok(_) => id = attr.next_id,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Err(e) => return Err(e),
        }
        let mut attr = IdAttr {
            id,
            ..Default::default()
        };
        let fd = match bpf(BPF_LINK_GET_FD_BY_ID, &mut attr) {
            // SAFETY: the kernel returned a new descriptor we now own.
            Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd as i32) },
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        let mut info = LinkInfo::default();
        let mut attr = InfoAttr {
            bpf_fd: fd.as_raw_fd() as u32,
            info_len: std::mem::size_of::<LinkInfo>() as u32,
            info: &mut info as *mut LinkInfo as u64,
        };
        bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
        out.push(info);
    }
}

#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    count: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// The ids of the programs attached at `attach_type` (tcx ingress or
/// egress) of interface `ifindex` of this network namespace, in run order.
/// `Unsupported` on a kernel without tcx (before Linux 6.6).
pub fn tcx_programs(ifindex: u32, attach_type: u32) -> io::Result<Vec<u32>> {
    let mut ids = vec![0u32; 64];
    loop {
        let mut attr = QueryAttr {
            target: ifindex,
            attach_type,
            prog_ids: ids.as_mut_ptr() as u64,
            count: ids.len() as u32,
            ..Default::default()
        };
        match bpf(BPF_PROG_QUERY, &mut attr) {
            Ok(_) => {
                ids.truncate(attr.count as usize);
                return Ok(ids);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                ids.resize(attr.count as usize + 16, 0);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(io::Error::new(io::ErrorKind::Unsupported, e));
            }
            Err(e) => return Err(e),
        }
    }
}
