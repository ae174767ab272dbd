//! The ephemeral port range check for masquerade source ports.

use std::fs;

use super::{SNAT_PORT_MAX, SNAT_PORT_MIN};

const _: () = assert!(SNAT_PORT_MAX == u16::MAX);

/// The local port range from `/proc/sys/net/ipv4/ip_local_port_range` text,
/// when it overlaps the masquerade source ports.
pub fn snat_port_overlap(local_port_range: &str) -> Option<(u16, u16)> {
    let mut it = local_port_range.split_whitespace().map(str::parse::<u16>);
    let (Some(Ok(low)), Some(Ok(high))) = (it.next(), it.next()) else {
        return None;
    };
    // The masquerade range runs to the last port, so only the upper end matters.
    (high >= SNAT_PORT_MIN).then_some((low, high))
}

/// Warns when the node's own connections may pick masquerade source ports:
/// the datapath would then translate their replies as a service flow's.
pub fn warn_if_snat_ports_overlap() {
    let path = "/proc/sys/net/ipv4/ip_local_port_range";
    let Ok(text) = fs::read_to_string(path) else {
        return;
    };
    if let Some((low, high)) = snat_port_overlap(&text) {
        tracing::warn!(
            local_ports = %format!("{low}-{high}"),
            masquerade_ports = %format!("{SNAT_PORT_MIN}-{SNAT_PORT_MAX}"),
            "net.ipv4.ip_local_port_range overlaps the ports used for masqueraded flows; \
             connections of the node itself may collide with them"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snat_ports_overlap_only_when_the_ranges_meet() {
        assert_eq!(snat_port_overlap("32768\t60999\n"), None);
        assert_eq!(snat_port_overlap("1024\t65535\n"), Some((1024, 65535)));
        assert_eq!(snat_port_overlap("61000 61000"), Some((61000, 61000)));
        assert_eq!(snat_port_overlap("garbage"), None);
    }
}
