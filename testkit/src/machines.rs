//! Several "machines" on one host: each a network namespace with its own
//! address, plus a host name (a UTS namespace) and a `/dev/shm` (a mount
//! namespace with a fresh tmpfs) that every process started on the machine
//! shares (a holder process keeps them; processes join them with nsenter), so
//! burn-ddp sees separate machines, shared memory within each, TCP between.
//! Every machine's `/etc/hosts` names them all (`machine-0`, ...), as a
//! cluster's DNS would; the rest of the file system, `/sys` included, is the
//! host's (so daemons that want cgroups, like slurmd, find them). The machines
//! hang off one bridge (in a namespace of its own), and a link's rate can be
//! limited with `tc`. Everything is torn down when the [`Machines`] is
//! dropped, however the test ends. Needs root and iproute2.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Set to 1 (as `.ci/run` does) to make missing root or iproute2 a failure,
/// not a skip.
pub const REQUIRE_NETNS_VAR: &str = "BURN_DDP_REQUIRE_NETNS";

/// Test beds made by this process so far (for unique names).
static MADE: AtomicUsize = AtomicUsize::new(0);

/// A set of machines joined by a private bridge.
pub struct Machines {
    /// Namespace of each machine.
    namespaces: Vec<String>,
    /// The process holding each machine's host name and `/dev/shm`.
    holders: Vec<std::process::Child>,
    /// Namespace holding the bridge.
    switch: String,
    /// The bridge's end of each machine's veth (in `switch`).
    ports: Vec<String>,
    /// Subnet `10.<a>.<b>.0/24`, unique to this test bed.
    subnet: [u8; 2],
    /// The `/etc/hosts` every machine sees: the host's, plus the machines.
    hosts: std::path::PathBuf,
}

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Machines {
    /// Makes `count` machines, or `Ok(None)` (a skip, said on stderr) where
    /// this host cannot and [`REQUIRE_NETNS_VAR`] is not set.
    pub fn create(count: usize) -> Result<Option<Self>, String> {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let has_ip = Command::new("ip")
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !root || !has_ip {
            let why = if root {
                "iproute2 is not installed"
            } else {
                "not root"
            };
            if std::env::var(REQUIRE_NETNS_VAR).is_ok_and(|v| v == "1") {
                return Err(format!(
                    "cannot make machines: {why}, but {REQUIRE_NETNS_VAR}=1"
                ));
            }
            eprintln!("    skipped: cannot make machines here ({why})");
            return Ok(None);
        }
        let serial = MADE.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        // A separator, so pid 1234 bed 56 and pid 12345 bed 6 differ.
        let tag = format!("{}x{serial}", pid % 100_000);
        let subnet = [100 + (pid % 100) as u8, (serial % 250) as u8];
        let mut machines = Self {
            namespaces: Vec::new(),
            holders: Vec::new(),
            switch: format!("bddp{tag}sw"),
            ports: Vec::new(),
            subnet,
            // The time too: a file a killed test left cannot be in the way.
            hosts: std::env::temp_dir().join(format!(
                "bddp{tag}-{}-hosts",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            )),
        };
        machines.write_hosts(count)?;
        // Built step by step: a failure half-way still tears down what exists.
        run(&["ip", "netns", "add", &machines.switch])?;
        run(&[
            "ip",
            "-n",
            &machines.switch,
            "link",
            "add",
            "br0",
            "type",
            "bridge",
        ])?;
        run(&["ip", "-n", &machines.switch, "link", "set", "br0", "up"])?;
        for i in 0..count {
            let ns = format!("bddp{tag}m{i}");
            run(&["ip", "netns", "add", &ns])?;
            machines.namespaces.push(ns.clone());
            let (inside, outside) = (format!("bd{tag}i{i}"), format!("bd{tag}o{i}"));
            run(&[
                "ip", "link", "add", &inside, "type", "veth", "peer", "name", &outside,
            ])?;
            run(&["ip", "link", "set", &inside, "netns", &ns])?;
            run(&["ip", "link", "set", &outside, "netns", &machines.switch])?;
            machines.ports.push(outside.clone());
            run(&["ip", "-n", &ns, "link", "set", &inside, "name", "eth0"])?;
            let cidr = format!("{}/24", machines.addr(i));
            run(&["ip", "-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
            run(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            run(&[
                "ip",
                "-n",
                &machines.switch,
                "link",
                "set",
                &outside,
                "master",
                "br0",
            ])?;
            run(&["ip", "-n", &machines.switch, "link", "set", &outside, "up"])?;
            // Not `ip netns exec`, which mounts a sysfs of its own over /sys
            // and so hides the host's cgroups.
            let holder = Command::new("unshare")
                .args(["--uts", "--mount", "--propagation", "private", "nsenter"])
                .arg(format!("--net=/run/netns/{ns}"))
                .args(["sh", "-c"])
                .arg(
                    "hostname \"$1\" && mount -t tmpfs tmpfs /dev/shm \
                     && mount --bind \"$2\" /etc/hosts && exec sleep 100000",
                )
                .args(["sh", &machines.hostname(i)])
                .arg(&machines.hosts)
                .stdin(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start machine {i}'s holder: {e}"))?;
            machines.holders.push(holder);
            machines.wait_until_ready(i)?;
        }
        Ok(Some(machines))
    }

    /// Writes the machines' `/etc/hosts`: the host's entries, then
    /// `machine-<i>` at each machine's address.
    fn write_hosts(&self, count: usize) -> Result<(), String> {
        let mut hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        if !hosts.is_empty() && !hosts.ends_with('\n') {
            hosts.push('\n');
        }
        for i in 0..count {
            hosts.push_str(&format!("{} {}\n", self.addr(i), self.hostname(i)));
        }
        // A new file: another bed's, bind-mounted by its machines, is never
        // rewritten.
        use std::io::Write;
        std::fs::File::options()
            .write(true)
            .create_new(true)
            .open(&self.hosts)
            .and_then(|mut file| file.write_all(hosts.as_bytes()))
            .map_err(|e| format!("cannot write {}: {e}", self.hosts.display()))
    }

    /// Waits (up to 5 s) until machine `i`'s holder has its host name,
    /// `/dev/shm` and `/etc/hosts` in place.
    fn wait_until_ready(&self, i: usize) -> Result<(), String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let out = Command::new("nsenter")
                .args(["-t", &self.holders[i].id().to_string(), "--uts", "hostname"])
                .output()
                .map_err(|e| format!("nsenter: {e}"))?;
            let mounted = Command::new("nsenter")
                .args(["-t", &self.holders[i].id().to_string(), "--mount"])
                .args(["sh", "-c", "grep -q ' /dev/shm tmpfs' /proc/self/mounts"])
                .status()
                .is_ok_and(|s| s.success())
                && Command::new("nsenter")
                    .args(["-t", &self.holders[i].id().to_string(), "--mount"])
                    .args(["getent", "hosts", &self.hostname(i)])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
            if mounted && String::from_utf8_lossy(&out.stdout).trim() == self.hostname(i) {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(format!("machine {i} did not come up"));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Number of machines.
    pub fn len(&self) -> usize {
        self.namespaces.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
    }

    /// Machine `i`'s address on the bridge.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, self.subnet[0], self.subnet[1], 1 + i as u8)
    }

    /// Machine `i`'s host name.
    pub fn hostname(&self, i: usize) -> String {
        format!("machine-{i}")
    }

    /// A command that runs `program` on machine `i`: in its network
    /// namespace, with its host name and its `/dev/shm`, in this process's
    /// current directory.
    pub fn command(&self, i: usize, program: &str) -> Command {
        let here = std::env::current_dir().unwrap_or_else(|_| "/".into());
        self.command_in(i, &here, program)
    }

    /// As [`Self::command`], in `dir` (entering a mount namespace resets the
    /// working directory, so a `Command::current_dir` would be lost).
    pub fn command_in(&self, i: usize, dir: &std::path::Path, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args(["-t", &self.holders[i].id().to_string()])
            .args(["--net", "--uts", "--mount"])
            .arg(format!("--wd={}", dir.display()))
            .arg("--")
            .arg(program);
        cmd
    }

    /// Limits what machine `i` sends to `rate` (`1gbit`), with tc's token
    /// bucket (netem, for delays, is not in every kernel).
    pub fn shape(&self, i: usize, rate: &str) -> Result<(), String> {
        let ns = &self.namespaces[i];
        run(&[
            "ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
            "rate", rate, "burst", "256kb", "latency", "50ms",
        ])
    }

    /// Cuts machine `i`'s link: both ends of its veth go down (its `eth0`, and
    /// the bridge's port), as when a cable is pulled. No process dies and no
    /// connection is reset; packets either way vanish (and new connections
    /// from the machine fail: its route is gone).
    pub fn cut(&self, i: usize) -> Result<(), String> {
        self.set_link(i, "down")
    }

    /// Brings machine `i`'s link back up after [`Self::cut`]: its route comes
    /// back, and connections that have not given up go on.
    pub fn restore(&self, i: usize) -> Result<(), String> {
        self.set_link(i, "up")
    }

    fn set_link(&self, i: usize, state: &str) -> Result<(), String> {
        let port = &self.ports[i];
        run(&[
            "ip",
            "-n",
            &self.namespaces[i],
            "link",
            "set",
            "eth0",
            state,
        ])?;
        run(&["ip", "-n", &self.switch, "link", "set", port, state])?;
        Ok(())
    }

    /// Kills every process on machine `i` with SIGKILL: the machine is gone.
    pub fn kill_all(&self, i: usize) -> usize {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.namespaces[i]])
            .output();
        let pids: Vec<i32> = out
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        for pid in &pids {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        pids.len()
    }
}

impl Drop for Machines {
    fn drop(&mut self) {
        for i in 0..self.namespaces.len() {
            self.kill_all(i);
        }
        for holder in &mut self.holders {
            let _ = holder.kill();
            let _ = holder.wait();
        }
        for ns in self.namespaces.iter().chain([&self.switch]) {
            let _ = run(&["ip", "netns", "del", ns]);
        }
        let _ = std::fs::remove_file(&self.hosts);
    }
}
