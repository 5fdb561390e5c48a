//! The bad-input matrix: each wrong setting, argument or file a user can give,
//! and the message it must produce — what is wrong, which rank, setting or
//! file, and what to do — instead of a panic, a hang or a wrong result.
//!
//! Faults that need whole processes (a rank started twice, a dead or stopped
//! peer, ranks with another transport) are in burn-ddp-comm's and
//! burn-ddp-run's multiprocess tests; docs/reliability.md lists them all.

use burn::backend::NdArray;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn_ddp_comm::{
    BucketConfig, DType, GradientSet, ParamInfo, ParamLayout, Placement, ProcessGroup, Reducer,
};
use burn_ddp_examples_common::idx;
use burn_ddp_rendezvous::env::LaunchEnv;
use burn_ddp_rendezvous::store::StoreServer;
use burn_ddp_sampler::DistributedSampler;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One bad input: its name, what it produces, and what that must say.
struct Case {
    name: &'static str,
    outcome: Box<dyn FnOnce() -> String>,
    says: &'static [&'static str],
}

fn case(
    name: &'static str,
    says: &'static [&'static str],
    outcome: impl FnOnce() -> String + 'static,
) -> Case {
    Case {
        name,
        outcome: Box::new(outcome),
        says,
    }
}

/// One f32 parameter of 4 elements, for the reducer's own checks.
struct OneGradient(Vec<ParamInfo>);

impl Default for OneGradient {
    fn default() -> Self {
        Self(vec![ParamInfo {
            id: 0,
            layout: ParamLayout {
                shape: vec![4],
                dtype: DType::F32,
            },
            placement: Placement::Host,
        }])
    }
}

impl GradientSet for OneGradient {
    fn params(&self) -> &[ParamInfo] {
        &self.0
    }

    fn read_host(&mut self, _index: usize, out: &mut [u8]) -> burn_ddp_comm::Result<()> {
        out.fill(0);
        Ok(())
    }

    fn write_host(&mut self, _index: usize, _averaged: &[u8]) -> burn_ddp_comm::Result<()> {
        Ok(())
    }
}

fn env_error(pairs: &[(&str, &str)]) -> String {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    match LaunchEnv::from_lookup(|name| map.get(name).cloned()) {
        Ok(env) => format!("accepted: {env:?}"),
        Err(err) => err.to_string(),
    }
}

const RANK_1_OF_2: [(&str, &str); 3] = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")];

fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut pairs = RANK_1_OF_2.to_vec();
    pairs.extend_from_slice(extra);
    pairs
}

/// A two-rank group in this process (the store hosted here); `body` runs on
/// rank 0 with rank 1 idle until rank 0 is done.
fn two_ranks(body: impl FnOnce(&ProcessGroup) -> String + Send + 'static) -> String {
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = server.addr().port();
    let build = move |rank: usize| {
        ProcessGroup::builder(rank, 2)
            .job(format!("two-ranks-{port}"), None)
            .master("127.0.0.1", port)
            .external_store(true)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let peer = std::thread::spawn(move || build(1));
    let group = build(0);
    let peer = peer.join().unwrap();
    let said = body(&group);
    drop((group, peer, server));
    said
}

/// Messages logged while `body` runs (a logger that keeps them).
fn logged(body: impl FnOnce()) -> String {
    static RECORDS: Mutex<Vec<String>> = Mutex::new(Vec::new());
    struct Keep;
    impl log::Log for Keep {
        fn enabled(&self, _: &log::Metadata) -> bool {
            true
        }
        fn log(&self, record: &log::Record) {
            RECORDS
                .lock()
                .unwrap()
                .push(format!("{}: {}", record.level(), record.args()));
        }
        fn flush(&self) {}
    }
    if log::set_logger(&Keep).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    RECORDS.lock().unwrap().clear();
    body();
    RECORDS.lock().unwrap().join("\n")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-ddp-bad-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn idx(magic: u32, dims: &[u32], body: &[u8]) -> Vec<u8> {
    let mut bytes = magic.to_be_bytes().to_vec();
    for d in dims {
        bytes.extend(d.to_be_bytes());
    }
    bytes.extend_from_slice(body);
    bytes
}

/// An MNIST folder with `n` images of `side`x`side` and the given labels.
fn mnist_dir(name: &str, images: Vec<u8>, labels: Vec<u8>) -> PathBuf {
    let dir = scratch(name);
    std::fs::write(dir.join("t10k-images-idx3-ubyte.gz"), gzip(&images)).unwrap();
    std::fs::write(dir.join("t10k-labels-idx1-ubyte.gz"), gzip(&labels)).unwrap();
    dir
}

fn images(n: u32, side: u32) -> Vec<u8> {
    idx(
        0x803,
        &[n, side, side],
        &vec![0u8; (n * side * side) as usize],
    )
}

fn labels(values: &[u8]) -> Vec<u8> {
    idx(0x801, &[values.len() as u32], values)
}

fn mnist_error(dir: &Path) -> String {
    match idx::load_split(dir, "t10k") {
        Ok(split) => format!("accepted {} samples", split.len()),
        Err(err) => err.to_string(),
    }
}

type B = NdArray;

fn cases() -> Vec<Case> {
    vec![
        // The launcher's environment.
        case("RANK beyond WORLD_SIZE", &["RANK=2", "0 to 1"], || {
            env_error(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")])
        }),
        case(
            "no MASTER_ADDR",
            &["rank 1", "MASTER_ADDR is not set", "burn-ddp-run"],
            || env_error(&[("RANK", "1"), ("WORLD_SIZE", "2")]),
        ),
        case(
            "RANK without WORLD_SIZE",
            &["RANK=0", "WORLD_SIZE", "set both"],
            || env_error(&[("RANK", "0")]),
        ),
        case(
            "WORLD_SIZE without RANK",
            &["WORLD_SIZE=4", "set RANK"],
            || env_error(&[("WORLD_SIZE", "4")]),
        ),
        case(
            "non-numeric RANK",
            &["RANK=\"x\"", "non-negative integer"],
            || env_error(&[("RANK", "x"), ("WORLD_SIZE", "2")]),
        ),
        case(
            "negative WORLD_SIZE",
            &["WORLD_SIZE=\"-2\"", "non-negative integer"],
            || env_error(&[("RANK", "0"), ("WORLD_SIZE", "-2")]),
        ),
        case("WORLD_SIZE of 0", &["WORLD_SIZE=0", "at least one"], || {
            env_error(&[("RANK", "0"), ("WORLD_SIZE", "0")])
        }),
        case(
            "negative LOCAL_RANK",
            &["LOCAL_RANK=\"-1\"", "non-negative integer"],
            || env_error(&with(&[("LOCAL_RANK", "-1")])),
        ),
        case("non-numeric LOCAL_RANK", &["LOCAL_RANK=\"gpu1\""], || {
            env_error(&with(&[("LOCAL_RANK", "gpu1")]))
        }),
        case(
            "LOCAL_RANK beyond LOCAL_WORLD_SIZE",
            &["LOCAL_RANK=3", "LOCAL_WORLD_SIZE=2", "0 to 1"],
            || env_error(&with(&[("LOCAL_RANK", "3"), ("LOCAL_WORLD_SIZE", "2")])),
        ),
        case(
            "MASTER_PORT out of range",
            &["MASTER_PORT=\"99999\"", "rank 1"],
            || env_error(&with(&[("MASTER_PORT", "99999")])),
        ),
        case(
            "MASTER_PORT of 0",
            &["MASTER_PORT=\"0\"", "1-65535"],
            || env_error(&with(&[("MASTER_PORT", "0")])),
        ),
        case(
            "huge timeout",
            &["BURN_DDP_TIMEOUT_SECS", "at most"],
            || env_error(&with(&[("BURN_DDP_TIMEOUT_SECS", "1e20")])),
        ),
        case(
            "negative timeout",
            &["BURN_DDP_TIMEOUT_SECS", "at most"],
            || env_error(&with(&[("BURN_DDP_TIMEOUT_SECS", "-5")])),
        ),
        case(
            "job token with a space",
            &["rank 1", "BURN_DDP_JOB_TOKEN", "openssl"],
            || env_error(&with(&[("BURN_DDP_JOB_TOKEN", "my secret")])),
        ),
        case(
            "job id with a slash",
            &["rank 1", "BURN_DDP_JOB_ID"],
            || env_error(&with(&[("BURN_DDP_JOB_ID", "team/run")])),
        ),
        case(
            "Open MPI rank beyond its size",
            &["OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=2"],
            || env_error(&[("OMPI_COMM_WORLD_RANK", "5"), ("OMPI_COMM_WORLD_SIZE", "2")]),
        ),
        // Joining.
        case(
            "ranks started with different WORLD_SIZE",
            &["WORLD_SIZE", "same WORLD_SIZE"],
            || {
                let server = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
                let port = server.addr().port();
                let join = move |rank: usize, world: usize| {
                    ProcessGroup::builder(rank, world)
                        .job("world-sizes", None)
                        .master("127.0.0.1", port)
                        .external_store(true)
                        .timeout(Duration::from_secs(3))
                        .build()
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_else(|| "joined".into())
                };
                let other = std::thread::spawn(move || join(1, 3));
                let mine = join(0, 2);
                format!("{mine}\n{}", other.join().unwrap())
            },
        ),
        case(
            "an unresolvable MASTER_ADDR fails fast",
            &[
                "rank 1",
                "cannot resolve MASTER_ADDR",
                "no-such-host.invalid",
                "fast",
            ],
            || {
                let started = Instant::now();
                let err = ProcessGroup::builder(1, 2)
                    .master("no-such-host.invalid", 29999)
                    .timeout(Duration::from_secs(120))
                    .build()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                let fast = if started.elapsed() < Duration::from_secs(15) {
                    "fast"
                } else {
                    "slow"
                };
                format!("{err} ({fast})")
            },
        ),
        // Collective arguments.
        case(
            "reduce_scatter of an uneven length",
            &["rank 0", "divisible", "pad"],
            || {
                two_ranks(|g| {
                    g.reduce_scatter(&[1.0f32; 3], burn_ddp_comm::ReduceOp::Sum)
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default()
                })
            },
        ),
        case(
            "broadcast from a rank that does not exist",
            &["rank 0", "root 5", "0 to 1"],
            || {
                two_ranks(|g| {
                    g.broadcast(&mut [1i64], 5)
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default()
                })
            },
        ),
        case(
            "a bucket cap of 0 bytes",
            &["rank 0", "at least one byte", "25 MiB"],
            || {
                let group = ProcessGroup::builder(0, 1).build().unwrap();
                let config = BucketConfig {
                    cap_bytes: 0,
                    first_cap_bytes: 1 << 20,
                };
                Reducer::new(&group, config)
                    .synchronize(&mut OneGradient::default())
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            },
        ),
        case("a negative bucket_cap_mb", &["bucket_cap_mb", "25"], || {
            burn_ddp::DdpConfig::new()
                .with_bucket_cap_mb(-1.0)
                .bucket_config(0)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        }),
        // Data.
        case(
            "a sampler rank beyond the replicas",
            &["rank 5", "[0, 1]", "group.rank()"],
            || {
                DistributedSampler::new(10, 2, 5)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            },
        ),
        case("a sampler with no replicas", &["num_replicas", "0"], || {
            DistributedSampler::new(10, 0, 0)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        }),
        case(
            "an empty dataset warns",
            &["WARN", "rank 1", "empty", "zero steps"],
            || {
                logged(|| {
                    DistributedSampler::new(0, 2, 1).unwrap();
                })
            },
        ),
        case(
            "MNIST: a missing file",
            &["not found", "--data-dir"],
            || mnist_error(&scratch("missing")),
        ),
        case(
            "MNIST: truncated gzip",
            &["t10k-images", "corrupt gzip"],
            || {
                let mut truncated = gzip(&images(4, 28));
                truncated.truncate(truncated.len() / 2);
                let dir = mnist_dir("truncated", vec![], labels(&[1, 2, 3, 4]));
                std::fs::write(dir.join("t10k-images-idx3-ubyte.gz"), truncated).unwrap();
                mnist_error(&dir)
            },
        ),
        case(
            "MNIST: garbled data",
            &["t10k-images", "not an MNIST image file"],
            || {
                let dir = mnist_dir("garbled", vec![], labels(&[1]));
                std::fs::write(
                    dir.join("t10k-images-idx3-ubyte.gz"),
                    gzip(b"<html>404</html>"),
                )
                .unwrap();
                mnist_error(&dir)
            },
        ),
        case(
            "MNIST: fewer labels than images",
            &["t10k-labels", "3 labels", "4 images"],
            || mnist_error(&mnist_dir("counts", images(4, 28), labels(&[1, 2, 3]))),
        ),
        case(
            "MNIST: a label above 9",
            &["t10k-labels", "label 12", "0-9"],
            || mnist_error(&mnist_dir("label", images(2, 28), labels(&[1, 12]))),
        ),
        case(
            "MNIST: images of another size",
            &["t10k-images", "32x32", "28x28"],
            || mnist_error(&mnist_dir("size", images(2, 32), labels(&[1, 2]))),
        ),
        // Checkpoints.
        case(
            "a checkpoint folder that cannot be written",
            &[
                "cannot write checkpoints into the folder",
                "not-a-folder",
                "choose a folder",
            ],
            || {
                let dir = scratch("unwritable");
                let blocker = dir.join("not-a-folder");
                std::fs::write(&blocker, b"a file where the folder should be").unwrap();
                let model: Linear<B> = LinearConfig::new(2, 2).init(&Default::default());
                burn_ddp::checkpoint::save_atomic::<B, _>(model.into_record(), blocker.join("ckpt"))
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            },
        ),
        case(
            "a corrupt checkpoint",
            &["garbage.mpk", "not a record of this model"],
            || {
                let path = scratch("corrupt").join("garbage.mpk");
                std::fs::write(&path, b"\x00\x01 not msgpack").unwrap();
                burn_ddp::checkpoint::load::<B, <Linear<B> as Module<B>>::Record>(
                    &path,
                    &Default::default(),
                )
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
            },
        ),
        case(
            "a checkpoint of a model of other sizes",
            &["small.mpk", "weight", "[3, 2]", "[5, 2]"],
            || {
                let device = Default::default();
                let path = scratch("sizes").join("small");
                let small: Linear<B> = LinearConfig::new(3, 2).init(&device);
                burn_ddp::checkpoint::save_atomic::<B, _>(small.into_record(), &path).unwrap();
                let big: Linear<B> = LinearConfig::new(5, 2).init(&device);
                burn_ddp::checkpoint::load_into::<B, _>(big, &path, &device)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            },
        ),
    ]
}

#[test]
fn every_bad_input_gets_a_message_that_names_it_and_the_fix() {
    let cases = cases();
    assert!(cases.len() >= 25, "the matrix shrank to {}", cases.len());
    let mut failures = Vec::new();
    let total = cases.len();
    for Case {
        name,
        outcome,
        says,
    } in cases
    {
        let said = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(outcome)) {
            Ok(said) => said,
            Err(_) => {
                failures.push(format!("{name}: panicked"));
                continue;
            }
        };
        let missing: Vec<_> = says.iter().filter(|s| !said.contains(**s)).collect();
        if !missing.is_empty() {
            failures.push(format!("{name}: missing {missing:?} in:\n  {said}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} bad inputs are not explained:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
