//! Whether a family's routing depends on a packet's destination (and the
//! interface it arrived on) alone, so that the datapath may share one FIB
//! answer between every flow to a destination (proxy-ebpf's `hops`).
//!
//! The datapath asks the FIB with the packet's addresses, ports and
//! protocol, and with its input interface; mark, TOS, output interface and
//! UID are constant in its queries. The answer can differ between two
//! flows to the same destination through the same interface only when a
//! rule selects by source, ports or protocol, when a route is
//! source-specific (IPv6), or when a route spreads flows over several next
//! hops (multipath, or a next-hop object that may be a group). A rule or
//! attribute this code does not know counts as one that might.

use netlink_packet_route::{
    AddressFamily,
    route::{RouteAttribute, RouteMessage},
    rule::{RuleAttribute, RuleMessage},
};

/// Whether `family`'s routing, as `rules` and `routes` (dumps of every
/// family) describe it, depends on the destination and input interface alone.
pub fn by_destination(
    family: AddressFamily,
    rules: &[RuleMessage],
    routes: &[RouteMessage],
) -> bool {
    let rules_ok = rules
        .iter()
        .filter(|r| r.header.family == family)
        .all(rule_selects_by_destination);
    let routes_ok = routes
        .iter()
        .filter(|r| r.header.address_family == family)
        .all(route_has_one_next_hop_for_all_sources);
    rules_ok && routes_ok
}

fn rule_selects_by_destination(rule: &RuleMessage) -> bool {
    rule.header.src_len == 0
        && rule.attributes.iter().all(|a| match a {
            RuleAttribute::Source(_)
            | RuleAttribute::IpProtocol(_)
            | RuleAttribute::SourcePortRange(_)
            | RuleAttribute::DestinationPortRange(_)
            | RuleAttribute::Other(_) => false,
            // The rest select by what is constant in the datapath's
            // queries (mark, output interface, UID, tunnel) or by what its
            // key holds (destination, input interface), or are actions.
            _ => true,
        })
}

fn route_has_one_next_hop_for_all_sources(route: &RouteMessage) -> bool {
    route.header.source_prefix_length == 0
        && route.attributes.iter().all(|a| match a {
            RouteAttribute::MultiPath(hops) => hops.len() <= 1,
            RouteAttribute::NhId(_) => false,
            _ => true,
        })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use netlink_packet_route::{
        route::{RouteAddress, RouteNextHop},
        rule::{RuleAction, RulePortRange},
    };

    use super::*;

    fn rule(family: AddressFamily, priority: u32, table: u32) -> RuleMessage {
        let mut rule = RuleMessage::default();
        rule.header.family = family;
        rule.header.action = RuleAction::ToTable;
        rule.attributes.push(RuleAttribute::Priority(priority));
        rule.attributes.push(RuleAttribute::Table(table));
        rule
    }

    /// The three rules of a fresh IPv4 namespace (local, main, default).
    fn default_rules(family: AddressFamily) -> Vec<RuleMessage> {
        vec![
            rule(family, 0, 255),
            rule(family, 32766, 254),
            rule(family, 32767, 253),
        ]
    }

    fn route(family: AddressFamily) -> RouteMessage {
        let mut route = RouteMessage::default();
        route.header.address_family = family;
        route.header.destination_prefix_length = 24;
        route.attributes.push(RouteAttribute::Oif(2));
        route
    }

    const V4: AddressFamily = AddressFamily::Inet;
    const V6: AddressFamily = AddressFamily::Inet6;

    #[test]
    fn default_rules_and_plain_routes_route_by_destination() {
        let rules = [default_rules(V4), default_rules(V6)].concat();
        let routes = [route(V4), route(V6)];
        assert!(by_destination(V4, &rules, &routes));
        assert!(by_destination(V6, &rules, &routes));
    }

    #[test]
    fn a_rule_by_source_ports_or_protocol_does_not() {
        let mut by_source = rule(V4, 100, 100);
        by_source.header.src_len = 24;
        let mut by_port = rule(V4, 100, 100);
        by_port
            .attributes
            .push(RuleAttribute::DestinationPortRange(RulePortRange {
                start: 80,
                end: 80,
            }));
        let mut by_mark = rule(V4, 100, 100);
        by_mark.attributes.push(RuleAttribute::FwMark(0x4000));
        for (odd, expected) in [(by_source, false), (by_port, false), (by_mark, true)] {
            let rules = [default_rules(V4), vec![odd.clone()]].concat();
            assert_eq!(
                by_destination(V4, &rules, &[route(V4)]),
                expected,
                "{odd:?}"
            );
            // The other family is not concerned.
            assert!(by_destination(V6, &rules, &[route(V6)]));
        }
    }

    #[test]
    fn multipath_source_specific_and_next_hop_object_routes_do_not() {
        let mut multipath = route(V4);
        multipath.attributes.push(RouteAttribute::MultiPath(vec![
            RouteNextHop::default(),
            RouteNextHop::default(),
        ]));
        let mut from = route(V6);
        from.header.source_prefix_length = 64;
        from.attributes
            .push(RouteAttribute::Source(RouteAddress::Inet6(Ipv6Addr::new(
                0x2001, 0xdb8, 0, 0, 0, 0, 0, 0,
            ))));
        let mut object = route(V4);
        object.attributes.push(RouteAttribute::NhId(7));
        let rules = [default_rules(V4), default_rules(V6)].concat();
        assert!(!by_destination(V4, &rules, &[multipath]));
        assert!(!by_destination(V6, &rules, &[from]));
        assert!(!by_destination(V4, &rules, &[object]));
        let mut single = route(V4);
        single
            .attributes
            .push(RouteAttribute::MultiPath(vec![RouteNextHop::default()]));
        assert!(by_destination(V4, &rules, &[single]));
    }
}
