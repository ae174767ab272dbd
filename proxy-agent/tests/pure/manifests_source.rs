//! The standalone manifests source: what it accepts, and that every
//! rejection names the file, the document and the field.

use std::fs;

use proxy_agent::sources::manifests::{self, ManifestError};

fn load(files: &[(&str, &str)]) -> Result<manifests::Manifests, ManifestError> {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        fs::write(dir.path().join(name), text).unwrap();
    }
    manifests::load_dir(dir.path())
}

const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns}\nspec:\n  clusterIP: 198.19.0.1\n  ports: [{port: 80, targetPort: 8080}]\n";
const SLICE: &str = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: ns, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints: [{addresses: [198.18.1.2]}]\n";

#[test]
fn the_shipped_example_loads() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/demo");
    let m = manifests::load_dir(&dir).unwrap();
    assert_eq!(
        (m.services.len(), m.endpoint_slices.len(), m.nodes.len()),
        (1, 1, 1)
    );
}

#[test]
fn multi_document_files_lists_and_json_are_read() {
    let list = format!(
        "apiVersion: v1\nkind: List\nitems:\n- {}\n",
        serde_json::to_string(&serde_yaml::from_str::<serde_json::Value>(SLICE).unwrap()).unwrap()
    );
    let json = serde_json::to_string(
        &serde_yaml::from_str::<serde_json::Value>(
            "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n",
        )
        .unwrap(),
    )
    .unwrap();
    let m = load(&[
        (
            "a.yaml",
            &format!("---\n{SERVICE}---\n# comment only\n---\n"),
        ),
        ("b.yml", &list),
        ("c.json", &json),
    ])
    .unwrap();
    assert_eq!(
        (m.services.len(), m.endpoint_slices.len(), m.nodes.len()),
        (1, 1, 1)
    );
}

#[test]
fn objects_for_another_proxy_or_of_headless_services_are_left_out_as_the_api_source_lists_them() {
    let other_proxy = SERVICE.replace(
        "metadata: {name: web, namespace: ns}",
        "metadata: {name: other, namespace: ns, labels: {service.kubernetes.io/service-proxy-name: foo}}",
    );
    let headless_slice = SLICE.replace(
        "name: web-1, namespace: ns, labels: {kubernetes.io/service-name: web}",
        "name: db-1, namespace: ns, labels: {kubernetes.io/service-name: db, service.kubernetes.io/headless: ''}",
    );
    let m = load(&[(
        "a.yaml",
        &format!(
            "{SERVICE}---
{other_proxy}---
{SLICE}---
{headless_slice}"
        ),
    )])
    .unwrap();
    let names = |metas: Vec<&Option<String>>| -> Vec<String> {
        metas.into_iter().flatten().cloned().collect()
    };
    assert_eq!(
        names(m.services.iter().map(|s| &s.metadata.name).collect()),
        ["web"]
    );
    assert_eq!(
        names(m.endpoint_slices.iter().map(|s| &s.metadata.name).collect()),
        ["web-1"]
    );
}

#[test]
fn other_kinds_and_other_files_are_ignored() {
    let m = load(&[
        (
            "a.yaml",
            &format!(
                "{SERVICE}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: x}}\n"
            ),
        ),
        ("notes.txt", "not yaml: ["),
        (".hidden.yaml", "not yaml: ["),
    ])
    .unwrap();
    assert_eq!(m.services.len(), 1);
}

fn rejection(files: &[(&str, &str)]) -> ManifestError {
    load(files).expect_err("must be rejected")
}

#[test]
fn invalid_yaml_names_the_file_and_document() {
    let e = rejection(&[("svc.yaml", &format!("{SERVICE}---\nkind: [unclosed\n"))]);
    assert!(e.file.ends_with("svc.yaml"));
    assert_eq!(e.document, Some(2));
    assert!(e.to_string().contains("invalid YAML"), "{e}");
}

#[test]
fn wrong_field_types_name_the_field_path() {
    let bad = SERVICE.replace("port: 80,", "port: eighty,");
    let e = rejection(&[("svc.yaml", &bad)]);
    assert_eq!(e.field.as_deref(), Some("spec.ports[0].port"), "{e}");
}

#[test]
fn invalid_values_name_the_field() {
    let cases = [
        (
            SERVICE.replace("198.19.0.1", "198.19.0.300"),
            "spec.clusterIP",
        ),
        (
            SERVICE.replace("port: 80,", "port: 70000,"),
            "spec.ports[0].port",
        ),
        (
            SERVICE.replace("port: 80,", "port: 80, protocol: ICMP,"),
            "spec.ports[0].protocol",
        ),
        (
            SLICE.replace("198.18.1.2", "2001:db8::1"),
            "endpoints[0].addresses[0]",
        ),
        (SLICE.replace("IPv4", "IPv5"), "addressType"),
        (SLICE.replace("port: 8080", "port: 0"), "ports[0].port"),
        (SERVICE.replace("apiVersion: v1\n", ""), "apiVersion"),
    ];
    for (text, field) in cases {
        let e = rejection(&[("x.yaml", &text)]);
        assert_eq!(e.field.as_deref(), Some(field), "for {text}: {e}");
        assert!(e.to_string().starts_with(&e.file.display().to_string()));
    }
}

#[test]
fn list_items_are_named_by_index() {
    let bad = SLICE.replace("198.18.1.2", "nope");
    let list = format!(
        "apiVersion: v1\nkind: List\nitems:\n- {}\n",
        serde_json::to_string(&serde_yaml::from_str::<serde_json::Value>(&bad).unwrap()).unwrap()
    );
    let e = rejection(&[("list.yaml", &list)]);
    assert_eq!(
        e.field.as_deref(),
        Some("items[0].endpoints[0].addresses[0]")
    );
}

#[test]
fn the_same_object_twice_is_rejected() {
    let e = rejection(&[("a.yaml", SERVICE), ("b.yaml", SERVICE)]);
    assert!(e.file.ends_with("b.yaml"));
    assert!(e.to_string().contains("defined twice"), "{e}");
}

#[test]
fn a_missing_directory_is_an_error() {
    let e = manifests::load_dir(std::path::Path::new("/nonexistent/manifests")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/manifests"));
}

const SERVICE_CIDR: &str = "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec:\n  cidrs: [198.19.0.0/16, '2001:db8:ffff::/108']\n";

#[test]
fn service_cidrs_are_read_and_validated_as_the_api_server_does() {
    let m = load(&[("cidr.yaml", SERVICE_CIDR)]).unwrap();
    assert_eq!(m.service_cidrs.len(), 1);
    let cases = [
        (
            SERVICE_CIDR.replace("198.19.0.0/16", "198.19.0.0/40"),
            "spec.cidrs[0]",
        ),
        (
            SERVICE_CIDR.replace("'2001:db8:ffff::/108'", "198.18.0.0/16"),
            "spec.cidrs[1]",
        ),
        (
            SERVICE_CIDR.replace("[198.19.0.0/16, '2001:db8:ffff::/108']", "[]"),
            "spec.cidrs",
        ),
    ];
    for (text, field) in cases {
        let e = rejection(&[("cidr.yaml", &text)]);
        assert_eq!(e.field.as_deref(), Some(field), "for {text}: {e}");
    }
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A file written into the directory is read at once (inotify), not at the
/// next poll: here the poll interval is an hour.
#[test]
fn a_written_file_is_read_at_once() {
    use futures::StreamExt as _;
    use proxy_agent::sources::SourceEvent;
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("svc.yaml"), SERVICE).unwrap();
    block_on(async {
        let hour = std::time::Duration::from_secs(3600);
        let mut events = Box::pin(manifests::events(dir.path().into(), "node".into(), hour));
        // The first read: the service, and both kinds listed.
        let mut first = Vec::new();
        while first.len() < 3 {
            first.push(events.next().await.unwrap());
        }
        assert!(
            first
                .iter()
                .any(|e| matches!(e, SourceEvent::ServiceApplied(_))),
            "{first:?}"
        );
        fs::write(dir.path().join("slice.yaml"), SLICE).unwrap();
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), events.next())
            .await
            .expect("the new file was not read within 5 s")
            .unwrap();
        assert!(matches!(next, SourceEvent::SliceApplied(_)), "{next:?}");
    });
}

/// The events the directory's source sends for each step of `steps`
/// (a change to the directory, then what arrived within a moment).
/// A change made to the manifests directory.
type Step = Box<dyn Fn(&std::path::Path)>;

fn events_after(dir: &std::path::Path, steps: Vec<Step>) -> Vec<Vec<String>> {
    use futures::StreamExt as _;
    block_on(async {
        let hour = std::time::Duration::from_secs(3600);
        let mut events = Box::pin(manifests::events(dir.into(), "node".into(), hour));
        let mut out = Vec::new();
        let mut first = true;
        for step in steps {
            if !first {
                step(dir);
            }
            let mut got = Vec::new();
            let wait = if first { 5000 } else { 1000 };
            while let Ok(Some(e)) =
                tokio::time::timeout(std::time::Duration::from_millis(wait), events.next()).await
            {
                got.push(describe(&e));
                if first && got.iter().any(|g| g == "SlicesSynced") {
                    break;
                }
            }
            first = false;
            out.push(got);
        }
        out
    })
}

fn describe(e: &proxy_agent::sources::SourceEvent) -> String {
    use proxy_agent::sources::SourceEvent::*;
    match e {
        ServiceApplied(s) => format!("Service {}", s.metadata.name.as_deref().unwrap_or("")),
        ServiceDeleted(k) => format!("ServiceDeleted {k}"),
        SliceApplied(s) => format!("Slice {}", s.metadata.name.as_deref().unwrap_or("")),
        SliceDeleted(k) => format!("SliceDeleted {k}"),
        ServicesSynced => "ServicesSynced".into(),
        SlicesSynced => "SlicesSynced".into(),
        other => format!("{other:?}"),
    }
}

const OTHER: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: ns}\nspec:\n  clusterIP: 198.19.0.2\n  ports: [{port: 5432}]\n";

/// Only the files that changed are read again, and only what changed in
/// them is sent; an object moved to another file is no change; a file
/// removed takes its objects; a duplicate across files is refused and the
/// last good state kept, until the clash is gone.
#[test]
fn changes_are_sent_file_by_file() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), SERVICE).unwrap();
    fs::write(dir.path().join("b.yaml"), SLICE).unwrap();
    let got = events_after(
        dir.path(),
        vec![
            Box::new(|_| {}),
            // The slice's endpoint changes: only it.
            Box::new(|d| {
                fs::write(d.join("b.yaml"), SLICE.replace("198.18.1.2", "198.18.1.3")).unwrap()
            }),
            // The service moves to another file, unchanged: nothing.
            Box::new(|d| {
                fs::write(d.join("c.yaml"), SERVICE).unwrap();
                fs::remove_file(d.join("a.yaml")).unwrap();
            }),
            // A second copy of it in a new file: refused, nothing sent.
            Box::new(|d| fs::write(d.join("d.yaml"), SERVICE).unwrap()),
            // The copy becomes another service: that one only.
            Box::new(|d| fs::write(d.join("d.yaml"), OTHER).unwrap()),
            // Its file goes: it goes.
            Box::new(|d| fs::remove_file(d.join("d.yaml")).unwrap()),
        ],
    );
    assert_eq!(
        got[0],
        [
            "Service web",
            "Slice web-1",
            "ServicesSynced",
            "SlicesSynced"
        ]
    );
    assert_eq!(got[1], ["Slice web-1"]);
    assert!(got[2].is_empty(), "{:?}", got[2]);
    assert!(got[3].is_empty(), "{:?}", got[3]);
    assert_eq!(got[4], ["Service db"]);
    assert_eq!(got[5], ["ServiceDeleted ns/db"]);
}

/// Files of many documents: each object in file order, errors and
/// duplicates named by their document's number, whatever the markers look
/// like.
#[test]
fn long_files_keep_their_document_numbers_and_duplicates() {
    let service = |i: usize| SERVICE.replace("name: web,", &format!("name: web-{i},"));
    // A leading comment, `--- ` with a comment after it, CRLF markers, a trailing `---`.
    let mut text = String::from("# generated\n");
    for i in 1..=1200 {
        let marker = match i % 3 {
            0 => "--- # next\n",
            1 => "---\r\n",
            _ => "---\n",
        };
        text.push_str(marker);
        text.push_str(&service(i));
    }
    text.push_str("---\n");
    let m = load(&[("many.yaml", &text)]).unwrap();
    assert_eq!(m.services.len(), 1200);
    assert!(
        m.services
            .iter()
            .enumerate()
            .all(|(i, s)| s.metadata.name.as_deref() == Some(format!("web-{}", i + 1).as_str())),
        "in file order"
    );

    let bad = text.replacen(
        &format!("{}---", service(900)),
        &format!("{}---", service(900).replace("port: 80,", "port: 70000,")),
        1,
    );
    let e = rejection(&[("many.yaml", &bad)]);
    assert_eq!(
        (e.document, e.field.as_deref()),
        (Some(900), Some("spec.ports[0].port")),
        "{e}"
    );

    let twice = text.replacen("name: web-1100,", "name: web-3,", 1);
    let e = rejection(&[("many.yaml", &twice)]);
    assert_eq!(e.document, Some(1100), "{e}");
    assert!(e.to_string().contains("defined twice"), "{e}");

    let broken = text.replacen("name: web-700,", "name: [web-700,", 1);
    assert_eq!(rejection(&[("many.yaml", &broken)]).document, Some(700));
}

/// A file truncated and not yet rewritten (an `fs::write` between its
/// truncation and its write, held open here across a poll) is not read
/// empty: the poll waits for the change to stand still, and the writer's
/// close reads the whole file.
#[test]
fn a_file_being_rewritten_is_not_read_half_way() {
    use futures::StreamExt as _;
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("svc.yaml");
    fs::write(&path, SERVICE).unwrap();
    block_on(async {
        let interval = std::time::Duration::from_millis(200);
        let mut events = Box::pin(manifests::events(
            dir.path().into(),
            "node".into(),
            interval,
        ));
        let mut first = Vec::new();
        while !first.iter().any(|e| describe(e) == "SlicesSynced") {
            first.push(events.next().await.unwrap());
        }
        // Truncated, held open past a poll (shorter than two), then written whole.
        let mut file = fs::File::create(&path).unwrap();
        let mut got = Vec::new();
        // The stream polls only while it is awaited.
        if let Ok(Some(e)) =
            tokio::time::timeout(std::time::Duration::from_millis(300), events.next()).await
        {
            got.push(describe(&e));
        }
        file.write_all(SERVICE.as_bytes()).unwrap();
        drop(file);
        while let Ok(Some(e)) =
            tokio::time::timeout(std::time::Duration::from_millis(1000), events.next()).await
        {
            got.push(describe(&e));
        }
        assert!(got.is_empty(), "the half-written file was read: {got:?}");
    });
}

fn to_json(yaml: &str) -> serde_json::Value {
    serde_yaml::from_str(yaml).unwrap()
}

/// JSON files take serde_json's path (as API lists arrive), not the YAML
/// parser's: the same objects and the same rejections, naming the same
/// document and field.
#[test]
fn json_files_give_the_objects_and_rejections_yaml_gives() {
    let node = "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n";
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List",
        "items": [to_json(SERVICE), to_json(SLICE)]});
    // Two documents in one file: a stream of JSON values.
    let stream = format!("{}\n{}", to_json(node), list);
    let from_json = load(&[("all.json", &stream)]).unwrap();
    let from_yaml = load(&[("all.yaml", &format!("{node}---\n{SERVICE}---\n{SLICE}"))]).unwrap();
    assert_eq!(from_json.services, from_yaml.services);
    assert_eq!(from_json.endpoint_slices, from_yaml.endpoint_slices);
    assert_eq!(from_json.nodes, from_yaml.nodes);
    assert_eq!(from_json.services.len(), 1);

    let bad_type = to_json(&SERVICE.replace("port: 80,", "port: eighty,"));
    let e = rejection(&[("svc.json", &bad_type.to_string())]);
    assert_eq!(e.field.as_deref(), Some("spec.ports[0].port"), "{e}");
    assert!(e.file.ends_with("svc.json"));

    let bad_item = serde_json::json!({"apiVersion": "v1", "kind": "List",
        "items": [to_json(SLICE), to_json(&SERVICE.replace("198.19.0.1", "198.19.0.300"))]});
    let e = rejection(&[("list.json", &bad_item.to_string())]);
    assert_eq!(e.field.as_deref(), Some("items[1].spec.clusterIP"), "{e}");

    let e = rejection(&[("two.json", &format!("{}\n{{\"kind\": [", to_json(node)))]);
    assert_eq!(e.document, Some(2), "{e}");
    assert!(e.to_string().contains("invalid JSON"), "{e}");

    let missing = to_json(&SERVICE.replace("apiVersion: v1\n", ""));
    let e = rejection(&[("x.json", &missing.to_string())]);
    assert_eq!(e.field.as_deref(), Some("apiVersion"), "{e}");

    let twice = format!("{}\n{}", to_json(SERVICE), to_json(SERVICE));
    let e = rejection(&[("twice.json", &twice)]);
    assert_eq!(
        (e.document, e.field.as_deref()),
        (Some(2), Some("metadata.name")),
        "{e}"
    );
}

/// A long `kind: List` is typed on several threads: its objects keep the
/// list's order, and a rejection names the first bad item, as when the
/// items were read one by one.
#[test]
fn a_long_json_list_keeps_its_order_and_names_its_first_bad_item() {
    let service = |i: usize, ip: &str| {
        to_json(
            &SERVICE
                .replace("name: web,", &format!("name: web-{i},"))
                .replace("198.19.0.1", ip),
        )
    };
    let items: Vec<_> = (0..5000)
        .map(|i| service(i, &format!("198.19.{}.{}", i / 250, i % 250)))
        .collect();
    let list = |items: &[serde_json::Value]| {
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
    };
    let loaded = load(&[("list.json", &list(&items))]).unwrap();
    let names: Vec<String> = loaded
        .services
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    let expected: Vec<String> = (0..5000).map(|i| format!("web-{i}")).collect();
    assert_eq!(names, expected);

    let mut bad = items.clone();
    bad[3700] = service(3700, "198.19.0.300");
    bad[4900] = service(4900, "198.19.0.301");
    let e = rejection(&[("list.json", &list(&bad))]);
    assert_eq!(
        e.field.as_deref(),
        Some("items[3700].spec.clusterIP"),
        "{e}"
    );
    bad[1200] = service(1200, "198.19.0.302");
    let e = rejection(&[("list.json", &list(&bad))]);
    assert_eq!(
        e.field.as_deref(),
        Some("items[1200].spec.clusterIP"),
        "{e}"
    );
}

/// A list's items are read first as the type of the item before them; an
/// item whose own head says otherwise is judged by it, as it always was.
#[test]
fn each_json_list_item_is_judged_by_its_own_apiversion_and_kind() {
    let svc = |name: &str| to_json(&SERVICE.replace("name: web,", &format!("name: {name},")));
    let slice = |name: &str| to_json(&SLICE.replace("name: web-1,", &format!("name: {name},")));
    let list = |items: Vec<serde_json::Value>| {
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
    };
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
    let mixed = list(vec![
        svc("a"),
        svc("b"),
        slice("s1"),
        slice("s2"),
        pod.clone(),
        svc("c"),
    ]);
    let m = load(&[("mixed.json", &mixed)]).unwrap();
    let names = |objects: Vec<Option<String>>| objects.into_iter().flatten().collect::<Vec<_>>();
    assert_eq!(
        names(m.services.iter().map(|s| s.metadata.name.clone()).collect()),
        ["a", "b", "c"]
    );
    assert_eq!(
        names(
            m.endpoint_slices
                .iter()
                .map(|s| s.metadata.name.clone())
                .collect()
        ),
        ["s1", "s2"]
    );

    // After an item of its type, an item without its kind or apiVersion is
    // still rejected for it, and one of another type read as that type.
    for (field, item) in [("kind", "kind"), ("apiVersion", "apiVersion")] {
        let mut bare = svc("b");
        bare.as_object_mut().unwrap().remove(field);
        let e = rejection(&[("list.json", &list(vec![svc("a"), bare]))]);
        assert_eq!(
            e.field.as_deref(),
            Some(format!("items[1].{item}").as_str()),
            "{e}"
        );
    }
    // The YAML parser (no one-pass read) judges every list alike.
    let mut relabelled = slice("s1");
    relabelled["kind"] = "Service".into();
    relabelled["apiVersion"] = "v1".into();
    let mut bad_port = slice("s2");
    bad_port["ports"][0]["port"] = "eighty".into();
    for (items, rejected_at) in [
        (vec![svc("a"), relabelled], None),
        (vec![slice("s1"), bad_port], Some("items[1].ports[0].port")),
        (vec![pod, slice("s1"), svc("a")], None),
    ] {
        let json = load(&[("list.json", &list(items.clone()))]);
        let as_yaml = serde_yaml::to_string(&serde_json::json!({
            "apiVersion": "v1", "kind": "List", "items": items
        }))
        .unwrap();
        let yaml = load(&[("list.yaml", &as_yaml)]);
        match (json, yaml) {
            (Ok(j), Ok(y)) => {
                assert_eq!(rejected_at, None);
                assert_eq!(j.services, y.services);
                assert_eq!(j.endpoint_slices, y.endpoint_slices);
            }
            (Err(j), Err(y)) => {
                assert_eq!(j.field.as_deref(), rejected_at, "{j}");
                assert_eq!(j.field, y.field, "{j} / {y}");
            }
            (j, y) => panic!("JSON {j:?}, YAML {y:?}"),
        }
    }
}

/// A JSON list re-read sends only the items whose text changed (their
/// digest is taken from the text, on the threads that type them).
#[test]
fn a_json_list_read_again_sends_only_the_items_that_changed() {
    let list = |other_ip: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            to_json(SERVICE), to_json(SLICE), to_json(&OTHER.replace("198.19.0.2", other_ip))]})
        .to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("all.json"), list("198.19.0.2")).unwrap();
    let got = events_after(
        dir.path(),
        vec![
            Box::new(|_| {}),
            Box::new(move |d| fs::write(d.join("all.json"), list("198.19.0.3")).unwrap()),
        ],
    );
    assert_eq!(
        got[0],
        [
            "Service web",
            "Service db",
            "Slice web-1",
            "ServicesSynced",
            "SlicesSynced"
        ]
    );
    assert_eq!(got[1], ["Service db"]);
}

#[test]
fn a_json_list_whose_items_are_not_an_array_is_rejected_naming_items() {
    let e = rejection(&[(
        "list.json",
        r#"{"apiVersion": "v1", "kind": "List", "items": {"a": 1}}"#,
    )]);
    assert_eq!(e.field.as_deref(), Some("items"), "{e}");
    assert!(e.to_string().contains("expected a sequence"), "{e}");
    // Another kind's own `items` is not a list's: the object is ignored.
    let m = load(&[(
        "cm.json",
        r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "items": {"a": 1}}"#,
    )])
    .unwrap();
    assert!(m.services.is_empty());
}
