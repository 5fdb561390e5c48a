//! The library crates impose no Burn backend: a program that depends on
//! burn-ddp (or burn-ddp-22) compiles only the backends it picks itself.

use std::collections::BTreeMap;
use std::process::Command;

/// Every package in `package`'s normal-dependency tree with its enabled
/// features, as cargo resolves them when building that package alone.
fn resolved_features(package: &str) -> BTreeMap<String, Vec<String>> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "-p", package, "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}|{f}", "--no-dedupe"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut packages = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let (id, features) = line.split_once('|').unwrap_or((line, ""));
        let name = id.split_whitespace().next().unwrap_or_default().to_string();
        let features = features
            .split(',')
            .filter(|f| !f.is_empty())
            .map(str::to_string);
        packages
            .entry(name)
            .or_insert_with(Vec::new)
            .extend(features);
    }
    packages
}

const BACKENDS: [&str; 9] = [
    "burn-ndarray",
    "burn-flex",
    "burn-cuda",
    "burn-wgpu",
    "burn-cpu",
    "burn-rocm",
    "burn-candle",
    "burn-tch",
    "burn-cubecl",
];

/// The layers below the Burn front-ends (rendezvous, communication,
/// training, the sampler's index math) depend on no Burn at all, so every
/// Burn version's front-end shares them.
#[test]
fn the_core_crates_depend_on_no_burn() {
    for core in [
        "burn-ddp-rendezvous",
        "burn-ddp-comm",
        "burn-ddp-training",
        "burn-ddp-sampler",
        "burn-ddp-examples-common",
    ] {
        let packages = resolved_features(core);
        let burn: Vec<&String> = packages
            .keys()
            .filter(|p| p.starts_with("burn-") || *p == "burn")
            .filter(|p| !p.starts_with("burn-ddp"))
            .collect();
        assert!(burn.is_empty(), "{core} depends on {burn:?}");
    }
}

/// Each Burn front-end takes Burn's core only (the features it names) and
/// leaves backends to the program.
#[test]
fn the_front_ends_alone_compile_no_backend() {
    let allowed: [(&str, &[&str]); 2] = [
        ("burn-ddp", &["std", "dataset"]),
        // `optim` (GradientsParams) turns on `autodiff` and the optional crate;
        // `extension` is SyncBatchNorm's backend extension, which routes to no
        // backend unless the crate's own backend features ask for one.
        (
            "burn-ddp-22",
            &[
                "std",
                "dataset",
                "optim",
                "autodiff",
                "burn-optim",
                "extension",
            ],
        ),
    ];
    for (library, features) in allowed {
        let packages = resolved_features(library);
        let burn = packages
            .get("burn")
            .unwrap_or_else(|| panic!("{library} depends on burn: {packages:?}"));
        let extra: Vec<&String> = burn
            .iter()
            .filter(|f| !features.contains(&f.as_str()))
            .collect();
        assert!(
            extra.is_empty(),
            "{library} turns on Burn features {extra:?} (all: {burn:?}); libraries take \
             Burn's core only and leave backends to the program"
        );
        let backends: Vec<&str> = BACKENDS
            .into_iter()
            .filter(|b| packages.contains_key(*b))
            .collect();
        assert!(
            backends.is_empty(),
            "{library} pulls in Burn backends {backends:?}"
        );
    }
}

/// Each layer depends only on the ones below it: the launcher is built on
/// the rendezvous layer alone (no process group, no training layer, no
/// Burn), communication knows nothing of training, training nothing of Burn.
#[test]
fn each_layer_builds_only_what_is_below_it() {
    let below: [(&str, &[&str], &[&str]); 4] = [
        (
            "burn-ddp-run",
            &["burn-ddp-rendezvous"],
            &[
                "burn-ddp-comm",
                "burn-ddp-training",
                "burn-ddp-sampler",
                "burn-ddp",
                "burn-ddp-22",
            ],
        ),
        (
            "burn-ddp-comm",
            &["burn-ddp-rendezvous"],
            &[
                "burn-ddp-training",
                "burn-ddp-sampler",
                "burn-ddp",
                "burn-ddp-22",
            ],
        ),
        (
            "burn-ddp-training",
            &["burn-ddp-comm", "burn-ddp-rendezvous"],
            &["burn-ddp-sampler", "burn-ddp", "burn-ddp-22"],
        ),
        (
            "burn-ddp-22",
            &["burn-ddp-training", "burn-ddp-comm", "burn-ddp-sampler"],
            &["burn-ddp"],
        ),
    ];
    for (package, needs, never) in below {
        let packages = resolved_features(package);
        for need in needs {
            assert!(
                packages.contains_key(*need),
                "{package} lacks {need}: {packages:?}"
            );
        }
        let found: Vec<&&str> = never
            .iter()
            .filter(|p| packages.contains_key(**p))
            .collect();
        assert!(
            found.is_empty(),
            "{package} builds {found:?}, layers above it"
        );
        if package == "burn-ddp-run" {
            let burn: Vec<&String> = packages
                .keys()
                .filter(|p| *p == "burn" || (p.starts_with("burn-") && !p.starts_with("burn-ddp")))
                .collect();
            assert!(burn.is_empty(), "the launcher builds Burn: {burn:?}");
        }
    }
}

/// The same inspection sees the backends the examples choose, so the check
/// above would catch a library that pulled one in.
#[test]
fn the_examples_pick_their_backends() {
    let packages = resolved_features("burn-ddp-examples");
    for backend in ["burn-ndarray", "burn-flex"] {
        assert!(packages.contains_key(backend), "{backend}: {packages:?}");
    }
    let burn = &packages["burn"];
    assert!(burn.contains(&"ndarray".to_string()), "{burn:?}");
    let packages = resolved_features("burn-ddp-22-examples");
    assert!(packages.contains_key("burn-flex"), "{packages:?}");
}

/// The `crate::` paths of a shared source (a file compiled into both
/// front-ends) that go around its door, as `(line, path)`: the door is the
/// shared folder itself (`crate::shared::...`, as every crate mounts it) and,
/// for the test programs, the crate's test shim (`crate::shim`). A
/// macro's `$crate::shared::` is the folder too; comments are not code.
fn paths_around_the_door(text: &str, door: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let path: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let names = |name: &str| {
                after.starts_with(name)
                    && !after[name.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
            };
            let through_door = names("shared") || names(door);
            if !through_door {
                found.push((number + 1, format!("crate::{path}")));
            }
            rest = after;
        }
    }
    found
}

/// Every `.rs` file under `dir`, recursively, with its text.
fn rust_sources(dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            files.push((path, text));
        }
    }
    files
}

/// The shared sources reach the crate that compiles them only through
/// `shared-src/contract.rs` (the library) and `crate::shim` (the test
/// programs): a `crate::data::...` in a shared file would be a second,
/// unwritten contract each crate must happen to keep.
#[test]
fn shared_sources_reach_their_crate_only_through_the_contract() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for (folder, door, contract) in [
        ("shared-src", "shared", "contract.rs"),
        ("shared-tests", "shim", ""),
    ] {
        let mut around = Vec::new();
        for (path, text) in rust_sources(&root.join(folder)) {
            if path.file_name().is_some_and(|name| name == contract) {
                continue;
            }
            for (line, found) in paths_around_the_door(&text, door) {
                around.push(format!("{}:{line}: {found}", path.display()));
            }
        }
        assert!(
            around.is_empty(),
            "shared sources naming their crate outside the contract (name the item in \
             shared-src/contract.rs, or in the test shim for shared-tests/, or use the \
             lower crates directly):\n{}",
            around.join("\n")
        );
    }
}

/// The check above catches what it is for, and lets the door through.
#[test]
fn the_contract_check_catches_a_path_around_the_door() {
    let text = "use crate::shared::contract::Visit; // crate::data in a comment\n\
                let s = crate::distributed_sampler(group, len)?;\n\
                $crate::shared::sync_batch_norm::check(x);\n\
                use crate::data::{DistributedDataset, Sampler};";
    assert_eq!(
        paths_around_the_door(text, "shared"),
        [
            (2, "crate::distributed_sampler".to_string()),
            (4, "crate::data::".to_string())
        ]
    );
    assert_eq!(
        paths_around_the_door(
            "use crate::shim; use crate::shimmer::ddp; use crate::Result;",
            "shim"
        ),
        [
            (1, "crate::shimmer::ddp".to_string()),
            (1, "crate::Result".to_string())
        ]
    );
}
