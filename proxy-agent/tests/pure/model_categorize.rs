//! Upstream `pkg/proxy/topology_test.go` TestCategorizeEndpoints, carried over as
//! facts. Upstream dropped the hints annotation check from kube-proxy (the
//! EndpointSlice controller only writes hints when the service asks for them,
//! e.g. `trafficDistribution: PreferClose`), so annotation-only cases fold into
//! "hints present" / "hints absent" here.

use proxy_agent::model::{
    Endpoint, Placement, Protocol, ServicePortInfo, SessionAffinity, categorize_endpoints,
};

const NODE: &str = "node-1";

#[derive(Clone, Copy, Default)]
struct Svc {
    itp_local: bool,
    etp_local: bool,
    node_port: Option<u16>,
}

fn info(s: Svc) -> ServicePortInfo {
    ServicePortInfo {
        cluster_ips: vec!["172.30.0.10".parse().unwrap()],
        port: 80,
        protocol: Protocol::Tcp,
        node_port: s.node_port,
        external_ips: vec![],
        load_balancer_ips: vec![],
        load_balancer_source_ranges: vec![],
        session_affinity: SessionAffinity::None,
        balancing: Default::default(),
        external_policy_local: s.etp_local,
        internal_policy_local: s.itp_local,
        health_check_node_port: None,
        publish_not_ready_addresses: false,
    }
}

#[derive(Clone, Copy, Default)]
struct E {
    addr: &'static str,
    ready: bool,
    serving: bool,
    terminating: bool,
    local: bool,
    zones: &'static [&'static str],
    nodes: &'static [&'static str],
}

fn ready(addr: &'static str) -> E {
    E {
        addr,
        ready: true,
        serving: true,
        ..E::default()
    }
}
fn zoned(addr: &'static str, zones: &'static [&'static str], ready: bool) -> E {
    E {
        addr,
        ready,
        serving: ready,
        zones,
        ..E::default()
    }
}
fn local(e: E) -> E {
    E { local: true, ..e }
}
fn unready(addr: &'static str) -> E {
    E {
        addr,
        ..E::default()
    }
}
fn terminating(addr: &'static str, is_local: bool) -> E {
    E {
        addr,
        serving: true,
        terminating: true,
        local: is_local,
        ..E::default()
    }
}

fn endpoint(e: &E) -> Endpoint {
    let sa: std::net::SocketAddr = e.addr.parse().unwrap();
    Endpoint {
        ip: sa.ip(),
        port: sa.port(),
        ready: e.ready,
        serving: e.serving,
        terminating: e.terminating,
        is_local: e.local,
        placement: Placement {
            node_name: Some(if e.local { NODE } else { "other" }.into()),
            zone: None,
            zone_hints: e.zones.iter().map(|z| z.to_string()).collect(),
            node_hints: e.nodes.iter().map(|n| n.to_string()).collect(),
        }
        .shared(),
    }
}

struct Case {
    name: &'static str,
    zone: Option<&'static str>,
    svc: Svc,
    eps: Vec<E>,
    cluster: Option<&'static [&'static str]>,
    local: Option<&'static [&'static str]>,
    /// `None`: same as whichever of cluster/local is used.
    all: Option<&'static [&'static str]>,
    /// Usable endpoints exist somewhere though none is reachable from here.
    only_remote: bool,
}

impl Default for Case {
    fn default() -> Self {
        Case {
            name: "",
            zone: Some("zone-a"),
            svc: Svc::default(),
            eps: vec![],
            cluster: None,
            local: None,
            all: None,
            only_remote: false,
        }
    }
}

fn four_zoned() -> Vec<E> {
    vec![
        zoned("10.1.2.3:80", &["zone-a"], true),
        zoned("10.1.2.4:80", &["zone-b"], true),
        zoned("10.1.2.5:80", &["zone-c"], true),
        zoned("10.1.2.6:80", &["zone-a"], true),
    ]
}

fn cases() -> Vec<Case> {
    const NP: Svc = Svc {
        itp_local: false,
        etp_local: false,
        node_port: Some(8080),
    };
    vec![
        Case {
            name: "hints present: filtered to the node's zone",
            eps: four_zoned(),
            cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
            ..Case::default()
        },
        Case {
            name: "externalTrafficPolicy: Local, topology ignored for Local endpoints",
            svc: Svc {
                etp_local: true,
                ..NP
            },
            eps: vec![
                local(zoned("10.1.2.3:80", &["zone-a"], true)),
                local(zoned("10.1.2.4:80", &["zone-b"], true)),
                zoned("10.1.2.5:80", &["zone-c"], true),
                zoned("10.1.2.6:80", &["zone-a"], true),
            ],
            cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
            local: Some(&["10.1.2.3:80", "10.1.2.4:80"]),
            all: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
            ..Case::default()
        },
        Case {
            name: "internalTrafficPolicy: Local, topology ignored for Local endpoints",
            svc: Svc {
                itp_local: true,
                ..NP
            },
            eps: vec![
                local(zoned("10.1.2.3:80", &["zone-a"], true)),
                local(zoned("10.1.2.4:80", &["zone-b"], true)),
                zoned("10.1.2.5:80", &["zone-c"], true),
                zoned("10.1.2.6:80", &["zone-a"], true),
            ],
            cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
            local: Some(&["10.1.2.3:80", "10.1.2.4:80"]),
            all: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
            ..Case::default()
        },
        Case {
            name: "empty node labels",
            zone: None,
            eps: vec![zoned("10.1.2.3:80", &["zone-a"], true)],
            cluster: Some(&["10.1.2.3:80"]),
            ..Case::default()
        },
        Case {
            name: "empty zone label",
            zone: Some(""),
            eps: vec![zoned("10.1.2.3:80", &["zone-a"], true)],
            cluster: Some(&["10.1.2.3:80"]),
            ..Case::default()
        },
        Case {
            name: "node in different zone, no endpoint filtering",
            zone: Some("zone-b"),
            eps: vec![zoned("10.1.2.3:80", &["zone-a"], true)],
            cluster: Some(&["10.1.2.3:80"]),
            ..Case::default()
        },
        Case {
            name: "unready endpoint",
            eps: vec![
                zoned("10.1.2.3:80", &["zone-a"], true),
                zoned("10.1.2.4:80", &["zone-b"], true),
                zoned("10.1.2.5:80", &["zone-c"], true),
                zoned("10.1.2.6:80", &["zone-a"], false),
            ],
            cluster: Some(&["10.1.2.3:80"]),
            ..Case::default()
        },
        Case {
            name: "only unready endpoints in same zone (should not filter)",
            eps: vec![
                zoned("10.1.2.3:80", &["zone-a"], false),
                zoned("10.1.2.4:80", &["zone-b"], true),
                zoned("10.1.2.5:80", &["zone-c"], true),
                zoned("10.1.2.6:80", &["zone-a"], false),
            ],
            cluster: Some(&["10.1.2.4:80", "10.1.2.5:80"]),
            ..Case::default()
        },
        Case {
            name: "missing hints, no filtering applied",
            eps: vec![
                zoned("10.1.2.3:80", &["zone-a"], true),
                zoned("10.1.2.4:80", &["zone-b"], true),
                zoned("10.1.2.5:80", &[], true),
                zoned("10.1.2.6:80", &["zone-a"], true),
            ],
            cluster: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"]),
            ..Case::default()
        },
        Case {
            name: "multiple hints per endpoint, filtering includes any endpoint with zone included",
            zone: Some("zone-c"),
            eps: vec![
                zoned("10.1.2.3:80", &["zone-a", "zone-b", "zone-c"], true),
                zoned("10.1.2.4:80", &["zone-b", "zone-c"], true),
                zoned("10.1.2.5:80", &["zone-b", "zone-d"], true),
                zoned("10.1.2.6:80", &["zone-c"], true),
            ],
            cluster: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
            ..Case::default()
        },
        Case {
            name: "conflicting topology and localness require merging allEndpoints",
            svc: Svc {
                etp_local: true,
                ..NP
            },
            eps: vec![
                local(zoned("10.0.0.0:80", &["zone-a"], true)),
                local(zoned("10.0.0.1:80", &["zone-b"], true)),
                zoned("10.0.0.2:80", &["zone-a"], true),
                zoned("10.0.0.3:80", &["zone-b"], true),
            ],
            cluster: Some(&["10.0.0.0:80", "10.0.0.2:80"]),
            local: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80", "10.0.0.2:80"]),
            ..Case::default()
        },
        Case {
            name: "PreferSameNode: every ready endpoint has node hints, one for this node",
            eps: vec![
                E {
                    nodes: &[NODE],
                    zones: &["zone-a"],
                    ..ready("10.0.0.1:80")
                },
                E {
                    nodes: &["other"],
                    zones: &["zone-a"],
                    ..ready("10.0.0.2:80")
                },
            ],
            cluster: Some(&["10.0.0.1:80"]),
            ..Case::default()
        },
        Case {
            name: "node hints name no endpoint for this node: zone hints apply",
            eps: vec![
                E {
                    nodes: &["other"],
                    zones: &["zone-a"],
                    ..ready("10.0.0.1:80")
                },
                E {
                    nodes: &["other"],
                    zones: &["zone-b"],
                    ..ready("10.0.0.2:80")
                },
            ],
            cluster: Some(&["10.0.0.1:80"]),
            ..Case::default()
        },
        Case {
            name: "internalTrafficPolicy: Local, with empty endpoints",
            svc: Svc {
                itp_local: true,
                ..Svc::default()
            },
            ..Case::default()
        },
        Case {
            name: "internalTrafficPolicy: Local, but all endpoints are remote",
            svc: Svc {
                itp_local: true,
                ..Svc::default()
            },
            eps: vec![ready("10.0.0.0:80"), ready("10.0.0.1:80")],
            local: Some(&[]),
            only_remote: true,
            ..Case::default()
        },
        Case {
            name: "internalTrafficPolicy: Local, all endpoints are local",
            svc: Svc {
                itp_local: true,
                ..Svc::default()
            },
            eps: vec![local(ready("10.0.0.0:80")), local(ready("10.0.0.1:80"))],
            local: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..Case::default()
        },
        Case {
            name: "internalTrafficPolicy: Local, some endpoints are local",
            svc: Svc {
                itp_local: true,
                ..Svc::default()
            },
            eps: vec![local(ready("10.0.0.0:80")), ready("10.0.0.1:80")],
            local: Some(&["10.0.0.0:80"]),
            ..Case::default()
        },
        Case {
            name: "Cluster traffic policy, endpoints not Ready",
            eps: vec![unready("10.0.0.0:80"), unready("10.0.0.1:80")],
            cluster: Some(&[]),
            ..Case::default()
        },
        Case {
            name: "Cluster traffic policy, some endpoints are Ready",
            eps: vec![unready("10.0.0.0:80"), ready("10.0.0.1:80")],
            cluster: Some(&["10.0.0.1:80"]),
            ..Case::default()
        },
        Case {
            name: "Cluster traffic policy, all endpoints are terminating",
            eps: vec![
                terminating("10.0.0.0:80", true),
                terminating("10.0.0.1:80", false),
            ],
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..Case::default()
        },
        Case {
            name: "serving but not terminating is no fallback",
            eps: vec![E {
                serving: true,
                ..unready("10.0.0.0:80")
            }],
            cluster: Some(&[]),
            ..Case::default()
        },
        Case {
            name: "iTP: Local, eTP: Cluster, some endpoints local",
            svc: Svc {
                itp_local: true,
                ..NP
            },
            eps: vec![local(ready("10.0.0.0:80")), ready("10.0.0.1:80")],
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            local: Some(&["10.0.0.0:80"]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..Case::default()
        },
        Case {
            name: "iTP: Cluster, eTP: Local, some endpoints local",
            svc: Svc {
                etp_local: true,
                ..NP
            },
            eps: vec![local(ready("10.0.0.0:80")), ready("10.0.0.1:80")],
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            local: Some(&["10.0.0.0:80"]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..Case::default()
        },
        Case {
            name: "iTP: Local, eTP: Local, some endpoints local",
            svc: Svc {
                itp_local: true,
                etp_local: true,
                ..NP
            },
            eps: vec![local(ready("10.0.0.0:80")), ready("10.0.0.1:80")],
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            local: Some(&["10.0.0.0:80"]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..Case::default()
        },
        Case {
            name: "iTP: Local, eTP: Local, all endpoints remote",
            svc: Svc {
                itp_local: true,
                etp_local: true,
                ..NP
            },
            eps: vec![ready("10.0.0.0:80"), ready("10.0.0.1:80")],
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            local: Some(&[]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..Case::default()
        },
        Case {
            name: "iTP: Local, eTP: Local, all endpoints remote and terminating",
            svc: Svc {
                itp_local: true,
                etp_local: true,
                ..NP
            },
            eps: vec![
                terminating("10.0.0.0:80", false),
                terminating("10.0.0.1:80", false),
            ],
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            local: Some(&[]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            only_remote: true,
            ..Case::default()
        },
        Case {
            name: "iTP: Cluster, eTP: Local, with terminating endpoints",
            svc: Svc {
                etp_local: true,
                ..NP
            },
            eps: vec![
                ready("10.0.0.0:80"),
                local(unready("10.0.0.1:80")),
                terminating("10.0.0.2:80", true),
                terminating("10.0.0.3:80", false),
            ],
            cluster: Some(&["10.0.0.0:80"]),
            local: Some(&["10.0.0.2:80"]),
            all: Some(&["10.0.0.0:80", "10.0.0.2:80"]),
            ..Case::default()
        },
        Case {
            name: "externalTrafficPolicy ignored if not externally accessible",
            svc: Svc {
                etp_local: true,
                ..Svc::default()
            },
            eps: vec![ready("10.0.0.0:80"), local(ready("10.0.0.1:80"))],
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..Case::default()
        },
        Case {
            name: "no cluster endpoints for iTP:Local internal-only service",
            svc: Svc {
                itp_local: true,
                ..Svc::default()
            },
            eps: vec![ready("10.0.0.0:80"), local(ready("10.0.0.1:80"))],
            local: Some(&["10.0.0.1:80"]),
            ..Case::default()
        },
    ]
}

fn strings(eps: &[Endpoint]) -> Vec<String> {
    let mut v: Vec<String> = eps.iter().map(ToString::to_string).collect();
    v.sort();
    v
}

fn owned(list: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = list.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[test]
fn categorize_endpoints_upstream_table() {
    let mut failures = Vec::new();
    for case in cases() {
        let eps: Vec<Endpoint> = case.eps.iter().map(endpoint).collect();
        let got = categorize_endpoints(&eps, &info(case.svc), NODE, case.zone);
        let cluster = got.cluster.as_deref().map(strings);
        let local = got.local.as_deref().map(strings);
        let want_all = case
            .all
            .or(case.cluster.xor(case.local))
            .map(owned)
            .unwrap_or_default();
        let want_any = !want_all.is_empty() || case.only_remote;
        if cluster != case.cluster.map(owned) {
            failures.push(format!(
                "{}: cluster {cluster:?} != {:?}",
                case.name, case.cluster
            ));
        }
        if local != case.local.map(owned) {
            failures.push(format!(
                "{}: local {local:?} != {:?}",
                case.name, case.local
            ));
        }
        if strings(&got.all_reachable) != want_all {
            failures.push(format!(
                "{}: all {:?} != {want_all:?}",
                case.name,
                strings(&got.all_reachable)
            ));
        }
        if got.has_any != want_any {
            failures.push(format!(
                "{}: has_any {} != {want_any}",
                case.name, got.has_any
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
