//! The source ports masqueraded flows leave with.
//!
//! A masqueraded flow's reply tuple (backend -> node address:port) must be
//! unique while its conntrack entry lives (a closed TCP flow: the kernel's
//! TIME_WAIT, 120 s), so the ports bound how many masqueraded connections a
//! backend can take: with 61000-65535 alone, about 38 a second, sustained.
//! The kernel's NAT may take any port from 1024 up because its conntrack also
//! knows the node's own connections; ours does not, so the node's ephemeral
//! range, where its own connections take their ports, stays out, and so does
//! the NodePort range. What is left is used, in up to two runs: with Linux's
//! defaults 1024-29999 and 61000-65535, 33,512 ports.

/// Linux's default `net.ipv4.ip_local_port_range`.
pub const LINUX_DEFAULT_EPHEMERAL: (u16, u16) = (32_768, 60_999);
/// Kubernetes' default NodePort range (`--service-node-port-range`).
const NODE_PORTS: (u16, u16) = (30_000, 32_767);
/// Used when the node leaves nothing else (its ephemeral range covers every
/// port): masqueraded flows may then share a tuple with its own connections.
const LAST_RESORT: (u16, u16) = (61_000, 65_535);

/// The node's ephemeral port range from `net.ipv4.ip_local_port_range`.
pub fn read_ephemeral_range() -> std::io::Result<(u16, u16)> {
    let path = "/proc/sys/net/ipv4/ip_local_port_range";
    let text = std::fs::read_to_string(path)?;
    parse_range(&text).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{path}: {:?} is not two ports", text.trim()),
        )
    })
}

fn parse_range(text: &str) -> Option<(u16, u16)> {
    let mut ports = text.split_whitespace().map(str::parse::<u16>);
    match (ports.next(), ports.next(), ports.next()) {
        (Some(Ok(low)), Some(Ok(high)), None) if low <= high => Some((low, high)),
        _ => None,
    }
}

/// The one or two runs of ports masqueraded flows take, largest first; the
/// second is (0, 0) when there is none.
pub fn masquerade_port_ranges(ephemeral: (u16, u16)) -> [(u16, u16); 2] {
    let mut free = vec![(1_024u32, 65_535u32)];
    for (low, high) in [ephemeral, NODE_PORTS] {
        let (low, high) = (u32::from(low), u32::from(high));
        free = free
            .into_iter()
            .flat_map(|(a, b)| {
                if high < a || low > b {
                    return vec![(a, b)];
                }
                [(a, low.saturating_sub(1)), (high + 1, b)]
                    .into_iter()
                    .filter(|(x, y)| x <= y && *y >= a && *x <= b)
                    .collect()
            })
            .collect();
    }
    free.sort_by_key(|(a, b)| std::cmp::Reverse(b - a));
    let narrow = |(a, b): (u32, u32)| (a as u16, b as u16);
    match free.as_slice() {
        [] => [LAST_RESORT, (0, 0)],
        [only] => [narrow(*only), (0, 0)],
        [first, second, ..] => [narrow(*first), narrow(*second)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_defaults_leave_the_ports_below_node_ports_and_above_the_ephemeral_range() {
        assert_eq!(
            masquerade_port_ranges(LINUX_DEFAULT_EPHEMERAL),
            [(1_024, 29_999), (61_000, 65_535)]
        );
    }

    #[test]
    fn a_wider_ephemeral_range_shrinks_what_is_left() {
        // Common tuning for nodes with many outgoing connections.
        assert_eq!(
            masquerade_port_ranges((10_000, 65_000)),
            [(1_024, 9_999), (65_001, 65_535)]
        );
        assert_eq!(
            masquerade_port_ranges((15_000, 65_535)),
            [(1_024, 14_999), (0, 0)]
        );
    }

    #[test]
    fn an_ephemeral_range_of_every_port_leaves_the_last_resort() {
        assert_eq!(
            masquerade_port_ranges((1_024, 65_535)),
            [LAST_RESORT, (0, 0)]
        );
        assert_eq!(masquerade_port_ranges((1, 65_535)), [LAST_RESORT, (0, 0)]);
    }

    #[test]
    fn an_ephemeral_range_overlapping_node_ports_is_carved_out_with_them() {
        assert_eq!(
            masquerade_port_ranges((20_000, 31_000)),
            [(32_768, 65_535), (1_024, 19_999)]
        );
    }

    #[test]
    fn the_sysctl_reads_as_two_ports() {
        assert_eq!(parse_range("32768\t60999\n"), Some((32_768, 60_999)));
        assert_eq!(parse_range("1024 65535"), Some((1_024, 65_535)));
        assert_eq!(parse_range("60999 32768"), None);
        assert_eq!(parse_range("32768"), None);
        assert_eq!(parse_range("a b"), None);
    }
}
