//! Maglev consistent hashing (Eisenbud et al., NSDI 2016, §3.4): a lookup
//! table of a prime size M per service port, each entry a backend, filled
//! from per-backend permutations of the table so that every backend gets
//! M/N entries (±1) and removing one of N backends moves about 1/N of the
//! entries, no others. The permutations depend only on the backends'
//! names (`address:port`) and M, so every node — and every restart — builds
//! the same table from the same backends, and a client tuple hashed into it
//! reaches the same backend everywhere.
//!
//! The names are hashed with SipHash-1-3 under fixed keys (`siphasher`,
//! whose output is specified, unlike std's `DefaultHasher`).

use std::{hash::Hasher as _, net::SocketAddr};

use proxy_common::{V4, V6, maglev::flow_hash};
use siphasher::sip::SipHasher13;

use super::family::AgentFamily;

/// Keys of the two hashes of the paper (offset and skip); fixed, so tables
/// agree across nodes and versions.
const OFFSET_KEYS: (u64, u64) = (0x6b75_6265_2d65_6270, 0x662d_7072_6f78_7931);
const SKIP_KEYS: (u64, u64) = (0x6d61_676c_6576_2d73, 0x6b69_702d_6b65_7931);

fn hash(keys: (u64, u64), name: &[u8]) -> u64 {
    let mut h = SipHasher13::new_with_keys(keys.0, keys.1);
    h.write(name);
    h.finish()
}

/// The table for `backends` (their stable names, in any order: the table
/// does not depend on it) of size `m`, a prime: entry `i` is the index into
/// `backends` of the backend that serves hash bucket `i`. Empty without
/// backends.
pub fn table<N: AsRef<[u8]>>(backends: &[N], m: u32) -> Vec<u32> {
    let n = backends.len();
    if n == 0 || m == 0 {
        return Vec::new();
    }
    let m64 = u64::from(m);
    // Sorted by name, so the order backends are given in does not matter
    // and equal names (which a service does not have) stay deterministic.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|a, b| backends[*a].as_ref().cmp(backends[*b].as_ref()));
    let perm: Vec<(u64, u64)> = order
        .iter()
        .map(|&i| {
            let name = backends[i].as_ref();
            let offset = hash(OFFSET_KEYS, name) % m64;
            let skip = if m > 1 {
                hash(SKIP_KEYS, name) % (m64 - 1) + 1
            } else {
                1
            };
            (offset, skip)
        })
        .collect();
    let mut next = vec![0u64; n];
    let mut entry = vec![u32::MAX; m as usize];
    let mut filled = 0u32;
    'fill: loop {
        for (k, &(offset, skip)) in perm.iter().enumerate() {
            let mut c = (offset + next[k] * skip) % m64;
            while entry[c as usize] != u32::MAX {
                next[k] += 1;
                c = (offset + next[k] * skip) % m64;
            }
            entry[c as usize] = order[k] as u32;
            next[k] += 1;
            filled += 1;
            if filled == m {
                break 'fill;
            }
        }
    }
    entry
}

/// The bucket of a table of `m` entries that a new flow from `client` to a
/// frontend's `port`/`proto` takes: what the programs compute.
pub fn bucket(client: SocketAddr, port: u16, proto: u8, m: u32) -> u32 {
    let hash = match client.ip() {
        std::net::IpAddr::V4(ip) => {
            flow_hash::<V4>(&V4::to_be(ip), client.port().to_be(), port.to_be(), proto)
        }
        std::net::IpAddr::V6(ip) => {
            flow_hash::<V6>(&V6::to_be(ip), client.port().to_be(), port.to_be(), proto)
        }
    };
    hash % m.max(1)
}

/// The entries of `next` that differ from `previous` (same size): what an
/// update writes. Every entry when the sizes differ.
pub fn changed(previous: &[u32], next: &[u32]) -> Vec<usize> {
    if previous.len() != next.len() {
        return (0..next.len()).collect();
    }
    (0..next.len())
        .filter(|&i| previous[i] != next[i])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("198.18.2.{}:8080", 10 + i))
            .collect()
    }

    #[test]
    fn every_backend_gets_its_share_of_the_table() {
        let backends = names(10);
        let t = table(&backends, 16381);
        assert_eq!(t.len(), 16381);
        let mut counts = [0u32; 10];
        for e in &t {
            counts[*e as usize] += 1;
        }
        for c in counts {
            assert!((1638..=1639).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn the_table_depends_on_the_backends_not_their_order() {
        let backends = names(7);
        let mut reversed = backends.clone();
        reversed.reverse();
        let a: Vec<&str> = table(&backends, 251)
            .iter()
            .map(|i| backends[*i as usize].as_str())
            .collect();
        let b: Vec<&str> = table(&reversed, 251)
            .iter()
            .map(|i| reversed[*i as usize].as_str())
            .collect();
        assert_eq!(a, b);
    }

    const PINNED: [u32; 13] = [2, 0, 0, 1, 1, 2, 2, 2, 0, 0, 1, 0, 1];

    #[test]
    fn a_fixed_table_for_fixed_names() {
        // Pinned output: a change of hash, keys or fill order would make
        // nodes of two versions disagree, and must be deliberate.
        let t = table(
            &["198.18.2.10:8080", "198.18.2.11:8080", "198.18.2.12:8080"],
            13,
        );
        assert_eq!(t, PINNED, "{t:?}");
    }

    #[test]
    fn removing_one_of_ten_backends_moves_about_a_tenth_and_nothing_else() {
        let backends = names(10);
        let before = table(&backends, 16381);
        let gone = 3usize;
        let rest: Vec<String> = backends
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != gone)
            .map(|(_, b)| b.clone())
            .collect();
        let after: Vec<&str> = table(&rest, 16381)
            .iter()
            .map(|i| rest[*i as usize].as_str())
            .collect();
        let before: Vec<&str> = before
            .iter()
            .map(|i| backends[*i as usize].as_str())
            .collect();
        let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
        let of_gone = before.iter().filter(|b| **b == backends[gone]).count();
        // Every entry of the gone backend moves; of the others, Maglev
        // moves only a small share (the paper's figure 13: a few percent).
        assert!(moved >= of_gone);
        let collateral = (moved - of_gone) as f64 / before.len() as f64;
        assert!(collateral < 0.03, "{collateral}");
        let share = moved as f64 / before.len() as f64;
        assert!((0.09..0.13).contains(&share), "{share}");
    }

    #[test]
    fn changed_lists_the_entries_to_write() {
        assert_eq!(changed(&[0, 1, 2], &[0, 2, 2]), [1]);
        assert_eq!(changed(&[0, 1], &[0, 1, 2]), [0, 1, 2]);
    }
}
