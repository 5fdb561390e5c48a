//! A real Slurm cluster for the tests: munged with a fresh key, slurmctld and
//! a slurmd per node, each in the foreground as a child of the test,
//! configured in a scratch folder (its own ports, state, spool and logs) and
//! torn down when the [`SlurmCluster`] is dropped: jobs cancelled, daemons
//! killed, the folder removed. One node is this host; several are the
//! network-namespace [`Machines`], slurmctld on the first. Every node has four
//! "GPUs" (gres backed by character devices in the scratch folder), so Slurm
//! hands out `CUDA_VISIBLE_DEVICES` as on a GPU cluster. Needs root and
//! Debian's `slurmctld`, `slurmd`, `slurm-client` and `munge` (what `.ci/run`
//! installs).

use crate::{free_port, Machines};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Set to 1 (as `.ci/run` does) to make a missing Slurm a failure, not a skip.
pub const REQUIRE_SLURM_VAR: &str = "BURN_DDP_REQUIRE_SLURM";

static MADE: AtomicUsize = AtomicUsize::new(0);

/// Each node's CPUs as Slurm is told (more than the machine has, so several
/// tasks fit on a 2-core CI machine with room to spare).
const CPUS: usize = 8;

/// Each node's GPUs as Slurm is told.
pub const GPUS_PER_NODE: usize = 4;
// One dummy device per GPU (see `make_gpus`).
const _: () = assert!(GPUS_PER_NODE <= 4);

/// A running cluster.
pub struct SlurmCluster<'m> {
    dir: PathBuf,
    conf: PathBuf,
    /// Each node's name and address.
    nodes: Vec<(String, String)>,
    /// The machines the nodes are, when not this host.
    machines: Option<&'m Machines>,
    daemons: Vec<(String, Child)>,
}

fn installed(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn hostname() -> Result<String, String> {
    let out = Command::new("hostname")
        .output()
        .map_err(|e| format!("hostname: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl SlurmCluster<'static> {
    /// Starts a cluster of one node, this host, or `Ok(None)` (a skip, said
    /// on stderr) where this host cannot and [`REQUIRE_SLURM_VAR`] is not set.
    pub fn start() -> Result<Option<Self>, String> {
        if !available()? {
            return Ok(None);
        }
        let node = hostname()?;
        // Tasks find rank 0 by the node's name, as on a real cluster.
        let resolves = Command::new("getent")
            .args(["hosts", &node])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !resolves {
            return Err(format!(
                "this host's name {node:?} does not resolve (getent hosts {node}); add it to \
                 /etc/hosts"
            ));
        }
        SlurmCluster::boot(vec![(node, "127.0.0.1".to_string())], None).map(Some)
    }
}

impl<'m> SlurmCluster<'m> {
    /// Starts a cluster whose nodes are `machines` (slurmctld on machine 0,
    /// a slurmd on each; clients run on machine 0), or `Ok(None)` as
    /// [`SlurmCluster::start`].
    pub fn on_machines(machines: &'m Machines) -> Result<Option<Self>, String> {
        if !available()? {
            return Ok(None);
        }
        let nodes = (0..machines.len())
            .map(|i| (machines.hostname(i), machines.addr(i).to_string()))
            .collect();
        Self::boot(nodes, Some(machines)).map(Some)
    }
}

/// Whether Slurm can run here: `Ok(false)` is a skip (said on stderr), an
/// error where [`REQUIRE_SLURM_VAR`] demands it.
fn available() -> Result<bool, String> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let missing: Vec<&str> = [
        "munged",
        "mungekey",
        "slurmctld",
        "slurmd",
        "srun",
        "sbatch",
    ]
    .into_iter()
    .filter(|program| !installed(program))
    .collect();
    if !root || !missing.is_empty() {
        let why = if root {
            format!("{} not installed", missing.join(", "))
        } else {
            "not root".to_string()
        };
        if std::env::var(REQUIRE_SLURM_VAR).is_ok_and(|v| v == "1") {
            return Err(format!(
                "cannot start Slurm: {why}, but {REQUIRE_SLURM_VAR}=1 (install slurmctld \
                     slurmd slurm-client munge)"
            ));
        }
        eprintln!("    skipped: cannot start Slurm here ({why})");
        return Ok(false);
    }
    Ok(true)
}

impl<'m> SlurmCluster<'m> {
    fn boot(nodes: Vec<(String, String)>, machines: Option<&'m Machines>) -> Result<Self, String> {
        if nodes.is_empty() {
            return Err("a Slurm cluster needs at least one node".into());
        }
        let serial = MADE.fetch_add(1, Ordering::SeqCst);
        let dir =
            std::env::temp_dir().join(format!("burn-ddp-slurm-{}-{serial}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["state".to_string()]
            .into_iter()
            .chain(nodes.iter().map(|(name, _)| format!("spool/{name}")))
        {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
        }
        let mut cluster = Self {
            conf: dir.join("slurm.conf"),
            nodes,
            machines,
            dir,
            daemons: Vec::new(),
        };
        // Built step by step: a failure half-way still stops what runs.
        cluster.start_munge()?;
        cluster.write_conf()?;
        cluster.make_gpus()?;
        cluster.spawn("slurmctld", "slurmctld", Some(0), &["-D", "-i"])?;
        for i in 0..cluster.nodes.len() {
            let name = cluster.nodes[i].0.clone();
            cluster.spawn(
                "slurmd",
                &format!("slurmd-{name}"),
                Some(i),
                &["-D", "-N", &name],
            )?;
        }
        cluster.wait_until_idle(Duration::from_secs(30))?;
        Ok(cluster)
    }

    fn start_munge(&mut self) -> Result<(), String> {
        let key = self.dir.join("munge.key");
        let out = Command::new("mungekey")
            .arg("--create")
            .arg(format!("--keyfile={}", key.display()))
            .arg("--force")
            .output()
            .map_err(|e| format!("mungekey: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mungekey failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let path = |name: &str| format!("{}", self.dir.join(name).display());
        let args = [
            "-F".to_string(),
            "--force".to_string(),
            format!("--socket={}", path("munge.socket")),
            format!("--key-file={}", key.display()),
            format!("--log-file={}", path("munged.log")),
            format!("--pid-file={}", path("munged.pid")),
            format!("--seed-file={}", path("munged.seed")),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.spawn("munged", "munged", None, &args)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.dir.join("munge.socket").exists() {
            if Instant::now() > deadline {
                return Err(format!("munged did not start:\n{}", self.logs()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn write_conf(&self) -> Result<(), String> {
        let dir = self.dir.display();
        let (ctld_port, slurmd_port) = (free_port(), free_port());
        let (controller, controller_addr) = &self.nodes[0];
        let node_lines: String = self
            .nodes
            .iter()
            .map(|(name, addr)| {
                format!(
                    "NodeName={name} NodeAddr={addr} CPUs={CPUS} Gres=gpu:{GPUS_PER_NODE} \
                     State=UNKNOWN\n"
                )
            })
            .collect();
        let conf = format!(
            "ClusterName=burnddp\n\
             SlurmctldHost={controller}({controller_addr})\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={dir}/munge.socket\n\
             CredType=cred/munge\n\
             StateSaveLocation={dir}/state\n\
             SlurmdSpoolDir={dir}/spool/%n\n\
             SlurmctldPidFile={dir}/slurmctld.pid\n\
             SlurmdPidFile={dir}/slurmd-%n.pid\n\
             SlurmctldPort={ctld_port}\n\
             SlurmdPort={slurmd_port}\n\
             SlurmctldLogFile={dir}/slurmctld.log\n\
             SlurmdLogFile={dir}/slurmd-%n.log\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             MpiDefault=none\n\
             SchedulerType=sched/builtin\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_CPU\n\
             SlurmdParameters=config_overrides\n\
             ReturnToService=2\n\
             KillWait=5\n\
             JobCompType=jobcomp/none\n\
             AccountingStorageType=accounting_storage/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             GresTypes=gpu\n\
             {node_lines}\
             PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        );
        std::fs::write(&self.conf, conf).map_err(|e| format!("slurm.conf: {e}"))
    }

    /// The GPUs: slurmd wants a distinct character device per GPU, so these
    /// are copies of /dev/null, /dev/zero, /dev/full and /dev/random (nothing
    /// opens them); Slurm numbers them 0..4 in `CUDA_VISIBLE_DEVICES`.
    fn make_gpus(&self) -> Result<(), String> {
        for (i, minor) in [3, 5, 7, 8].into_iter().enumerate().take(GPUS_PER_NODE) {
            let path = self.dir.join(format!("gpu{i}"));
            let status = Command::new("mknod")
                .arg(&path)
                .args(["c", "1", &minor.to_string()])
                .status()
                .map_err(|e| format!("mknod: {e}"))?;
            if !status.success() {
                return Err(format!("mknod {} failed ({status})", path.display()));
            }
        }
        let gres = format!(
            "Name=gpu File={}/gpu[0-{}]\n",
            self.dir.display(),
            GPUS_PER_NODE - 1
        );
        std::fs::write(self.dir.join("gres.conf"), gres).map_err(|e| format!("gres.conf: {e}"))
    }

    /// Starts `daemon` on node `node` (`None`: this host, outside the
    /// machines), its stderr in `<label>.err`.
    fn spawn(
        &mut self,
        daemon: &str,
        label: &str,
        node: Option<usize>,
        args: &[&str],
    ) -> Result<(), String> {
        let mut cmd = match (self.machines, node) {
            (Some(machines), Some(i)) => machines.command_in(i, &self.dir, daemon),
            _ => Command::new(daemon),
        };
        let child = cmd
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.dir.join(format!("{label}.err")))
                    .map_err(|e| e.to_string())?,
            )
            .spawn()
            .map_err(|e| format!("cannot start {daemon}: {e}"))?;
        self.daemons.push((label.to_string(), child));
        Ok(())
    }

    fn wait_until_idle(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let out = self
                .command("sinfo")
                .args(["-h", "-N", "-o", "%T"])
                .output();
            if let Ok(out) = out {
                let states = String::from_utf8_lossy(&out.stdout).to_string();
                let idle = states.lines().filter(|state| *state == "idle").count();
                if idle == self.nodes.len() {
                    return Ok(());
                }
            }
            let exited = self.daemons.iter_mut().find_map(|(daemon, child)| {
                let status = child.try_wait().ok().flatten()?;
                Some(format!("{daemon} exited ({status})"))
            });
            if let Some(exited) = exited {
                return Err(format!("{exited}:\n{}", self.logs()));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the node was not idle after {limit:?}:\n{}",
                    self.logs()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last lines of the daemons' logs, for a failure message.
    pub fn logs(&self) -> String {
        let mut names = vec![
            "munged.log".to_string(),
            "slurmctld.log".to_string(),
            "slurmctld.err".to_string(),
        ];
        for (node, _) in &self.nodes {
            names.push(format!("slurmd-{node}.log"));
            names.push(format!("slurmd-{node}.err"));
        }
        names
            .iter()
            .filter_map(|name| {
                let text = std::fs::read_to_string(self.dir.join(name)).ok()?;
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                Some(format!("--- {name}\n{tail}"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A Slurm client command (`srun`, `sbatch`, `scancel`, `squeue`, ...)
    /// talking to this cluster, without the test's own Slurm or launcher
    /// variables, in this process's current directory.
    pub fn command(&self, program: &str) -> Command {
        let here = std::env::current_dir().unwrap_or_else(|_| "/".into());
        self.command_in(&here, program)
    }

    /// As [`Self::command`], in `dir` (on the first node when the nodes are
    /// machines: a client there reaches every node, as on a login node).
    pub fn command_in(&self, dir: &Path, program: &str) -> Command {
        let mut cmd = match self.machines {
            Some(machines) => machines.command_in(0, dir, program),
            None => {
                let mut cmd = Command::new(program);
                cmd.current_dir(dir);
                cmd
            }
        };
        cmd.env("SLURM_CONF", &self.conf).stdin(Stdio::null());
        for (name, _) in std::env::vars() {
            if name.starts_with("SLURM_")
                || ["RANK", "WORLD_SIZE", "MASTER_ADDR"].contains(&name.as_str())
            {
                cmd.env_remove(name);
            }
        }
        cmd
    }

    /// A command that runs `program` on node `node` (its network, host name
    /// and `/dev/shm`), outside Slurm.
    pub fn on_node(&self, node: usize, program: &str) -> Command {
        match self.machines {
            Some(machines) => machines.command(node, program),
            None => Command::new(program),
        }
    }

    /// The nodes' names and addresses.
    pub fn nodes(&self) -> Vec<(&str, &str)> {
        self.nodes
            .iter()
            .map(|(name, addr)| (name.as_str(), addr.as_str()))
            .collect()
    }

    /// The scratch folder (configuration, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The ids of the jobs in the queue.
    pub fn jobs(&self) -> Vec<String> {
        let out = self.command("squeue").args(["-h", "-o", "%i"]).output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
    }

    /// Waits until job `id` has left the queue; false after `limit`.
    pub fn wait_for_job_end(&self, id: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let out = self
                .command("squeue")
                .args(["-h", "-j", id, "-o", "%T"])
                .output();
            match out {
                Ok(Output { stdout, .. }) if String::from_utf8_lossy(&stdout).trim().is_empty() => {
                    return true
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        false
    }
}

impl Drop for SlurmCluster<'_> {
    fn drop(&mut self) {
        let _ = self
            .command("scancel")
            .args(["--full", "-u", "root"])
            .output();
        for id in self.jobs() {
            self.wait_for_job_end(&id, Duration::from_secs(10));
        }
        // slurmd first, so it cannot start anything more; munged last. SIGTERM
        // lets slurmctld take its helper (slurmscriptd) down with it.
        for (_, child) in self.daemons.iter_mut().rev() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
