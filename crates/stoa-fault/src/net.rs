//! The network between nodes: one network namespace per node, each with one veth into a
//! bridge that lives in a namespace of its own, so that nothing of the test touches the
//! host's interfaces, addresses or firewall. Faults are nftables rules inside the node
//! namespaces: a rule in A's output chain that drops packets for B cuts A -> B only.
//!
//! ```text
//!   ns TAG-m1 (eth0 10.77.0.1) --veth--+
//!   ns TAG-c1 (eth0 10.77.0.11) -veth--+-- br0 in ns TAG-br
//!   ns TAG-ctl (eth0 10.77.0.250) -----+      (the harness's own probe, never cut)
//! ```
//!
//! Every name starts with `stf<pid>`, so a later run can find and delete what a crashed
//! run left behind (see [`sweep`]).

use crate::error::{FaultError, Result};
use std::net::Ipv4Addr;
use std::process::Command;

/// Runs a command to completion, failing with its stderr.
///
/// Commands go through a shell started with the first of them, before any workload
/// runs, never forked from this process itself: a child forked from a process whose
/// threads wait on a FUSE mount that does not answer can take a minute to exec (seen
/// in `client-fenced`: a heal's `ip netns exec` took 16 to 64 s, so the cut lasted that
/// much longer than the scenario said, while the same command from another process
/// took 3 ms).
pub fn run(prog: &str, args: &[&str]) -> Result<String> {
    let cmd = format!("{prog} {}", args.join(" "));
    let fail = |detail: String| FaultError::Command { cmd: cmd.clone(), detail };
    static SHELL: std::sync::OnceLock<std::sync::Mutex<Option<Shell>>> = std::sync::OnceLock::new();
    let mut shell = SHELL.get_or_init(Default::default).lock().expect("shell lock poisoned");
    if shell.is_none() {
        *shell = Some(Shell::start().map_err(|e| fail(format!("starting sh: {e}")))?);
    }
    let sh = shell.as_mut().expect("started above");
    let (status, out, err) = match sh.run(prog, args) {
        Ok(done) => done,
        Err(e) => {
            // The shell is gone or out of step: the next command starts another.
            *shell = None;
            return Err(fail(format!("through sh: {e}")));
        }
    };
    if status != 0 {
        return Err(fail(format!("exit status {status}: {}", err.trim())));
    }
    Ok(out)
}

/// A shell that runs the harness's commands, one at a time, and tells their exit status.
struct Shell {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    out: std::path::PathBuf,
    err: std::path::PathBuf,
}

impl Shell {
    fn start() -> std::io::Result<Shell> {
        use std::process::Stdio;
        let mut child = Command::new("sh").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let base = std::env::temp_dir().join(format!("{}-sh", owner_prefix()));
        let (out, err) = (base.with_extension("out"), base.with_extension("err"));
        Ok(Shell { child, stdin, stdout, out, err })
    }

    fn run(&mut self, prog: &str, args: &[&str]) -> std::io::Result<(i32, String, String)> {
        use std::io::{BufRead, Write};
        let mut line = quote(prog);
        for a in args {
            line.push(' ');
            line.push_str(&quote(a));
        }
        let (out, err) = (self.out.to_string_lossy(), self.err.to_string_lossy());
        writeln!(
            self.stdin,
            "{line} </dev/null >{} 2>{}; echo \"rc $?\"",
            quote(&out),
            quote(&err)
        )?;
        self.stdin.flush()?;
        let mut answer = String::new();
        self.stdout.read_line(&mut answer)?;
        let status = answer
            .trim()
            .strip_prefix("rc ")
            .and_then(|rc| rc.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("unexpected answer {answer:?}")))?;
        let read = |p: &std::path::Path| {
            let text = std::fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned());
            let _ = std::fs::remove_file(p);
            text
        };
        Ok((status, read(&self.out)?, read(&self.err)?))
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `s` as one word for sh.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Runs a command inside network namespace `ns`.
pub fn run_in(ns: &str, prog: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["netns", "exec", ns, prog];
    all.extend_from_slice(args);
    run("ip", &all)
}

/// The prefix of every name this process creates.
pub fn owner_prefix() -> String {
    format!("stf{}", std::process::id())
}

/// One host on the test network.
#[derive(Clone, Debug)]
pub struct Host {
    /// Short name, unique in the cluster: m1, c2, k1, ctl.
    pub name: String,
    pub ns: String,
    pub ip: Ipv4Addr,
}

/// The namespaces and links of one test network. Dropping it deletes them.
pub struct Net {
    tag: String,
    bridge_ns: String,
    hosts: Vec<Host>,
}

const NFT_SETUP: &str = "table inet stf {
  chain out { type filter hook output priority 0; policy accept; }
  chain in { type filter hook input priority 0; policy accept; }
}
";

impl Net {
    /// Creates the bridge namespace. Hosts are added with [`Net::add_host`].
    pub fn create(tag: &str) -> Result<Net> {
        let bridge_ns = format!("{tag}-br");
        run("ip", &["netns", "add", &bridge_ns])?;
        let net = Net { tag: tag.to_string(), bridge_ns, hosts: Vec::new() };
        run_in(&net.bridge_ns, "ip", &["link", "add", "br0", "type", "bridge"])?;
        run_in(&net.bridge_ns, "ip", &["link", "set", "br0", "up"])?;
        Ok(net)
    }

    /// Adds a host namespace named `name` with address 10.77.0.`octet`.
    pub fn add_host(&mut self, name: &str, octet: u8) -> Result<Host> {
        let ns = format!("{}-{name}", self.tag);
        run("ip", &["netns", "add", &ns])?;
        let host =
            Host { name: name.to_string(), ns: ns.clone(), ip: Ipv4Addr::new(10, 77, 0, octet) };
        self.hosts.push(host.clone());
        let peer = format!("v-{name}");
        run(
            "ip",
            &[
                "link",
                "add",
                "eth0",
                "netns",
                &ns,
                "type",
                "veth",
                "peer",
                "name",
                &peer,
                "netns",
                &self.bridge_ns,
            ],
        )?;
        run_in(&self.bridge_ns, "ip", &["link", "set", &peer, "master", "br0", "up"])?;
        run_in(&ns, "ip", &["addr", "add", &format!("{}/24", host.ip), "dev", "eth0"])?;
        run_in(&ns, "ip", &["link", "set", "eth0", "up"])?;
        run_in(&ns, "ip", &["link", "set", "lo", "up"])?;
        nft(&ns, NFT_SETUP)?;
        Ok(host)
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts.iter().find(|h| h.name == name).unwrap_or_else(|| panic!("no host {name}"))
    }

    /// Drops every packet `from` sends to `to` (one direction).
    pub fn cut_one_way(&self, from: &str, to: &str) -> Result<()> {
        let (a, b) = (self.host(from), self.host(to));
        nft(&a.ns, &format!("add rule inet stf out ip daddr {} drop\n", b.ip))
    }

    /// Cuts both directions between two hosts.
    pub fn cut(&self, a: &str, b: &str) -> Result<()> {
        self.cut_one_way(a, b)?;
        self.cut_one_way(b, a)
    }

    /// Cuts `name` off from every host in `others`, both ways.
    pub fn isolate(&self, name: &str, others: &[String]) -> Result<()> {
        for o in others.iter().filter(|o| o.as_str() != name) {
            self.cut(name, o)?;
        }
        Ok(())
    }

    /// Removes every cut.
    pub fn heal(&self) -> Result<()> {
        for h in &self.hosts {
            nft(&h.ns, "flush chain inet stf out\nflush chain inet stf in\n")?;
        }
        Ok(())
    }

    fn teardown(&mut self) {
        for h in self.hosts.drain(..) {
            kill_namespace(&h.ns);
        }
        kill_namespace(&self.bridge_ns);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.teardown();
    }
}

fn nft(ns: &str, script: &str) -> Result<()> {
    let path = std::env::temp_dir().join(format!("{}-{}.nft", owner_prefix(), ns));
    std::fs::write(&path, script).map_err(|e| FaultError::io("write", &path, e))?;
    let result = run_in(ns, "nft", &["-f", &path.to_string_lossy()]);
    let _ = std::fs::remove_file(&path);
    result.map(|_| ())
}

/// Kills every process left in namespace `ns` and deletes it.
fn kill_namespace(ns: &str) {
    if let Ok(pids) = run("ip", &["netns", "pids", ns]) {
        for pid in pids.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            // SAFETY: plain kill(2); these processes live in a namespace this harness made.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let _ = run("ip", &["netns", "del", ns]);
}

/// Deletes namespaces, processes and mounts left by runs whose process is gone (their
/// names start with `stf<pid>` and no process `pid` exists).
pub fn sweep() -> Result<usize> {
    let list = run("ip", &["netns", "list"])?;
    let mut removed = 0;
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = leftover_owner(name) else { continue };
        if pid_alive(pid) {
            continue;
        }
        kill_namespace(name);
        removed += 1;
    }
    sweep_mounts();
    Ok(removed)
}

/// The owning pid encoded in a name `stf<pid>x<n>-...`.
fn leftover_owner(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("stf")?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

fn pid_alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Lazily unmounts FUSE and tmpfs mounts under `/tmp/stf<pid>...` of dead runs.
fn sweep_mounts() {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let tmp = std::env::temp_dir().to_string_lossy().to_string();
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|p| {
            p.strip_prefix(&format!("{tmp}/"))
                .and_then(leftover_owner)
                .is_some_and(|pid| !pid_alive(pid))
        })
        .collect();
    // Deepest first, so that a mount inside another goes before it.
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = run("umount", &["-l", &p]);
    }
    let Ok(entries) = std::fs::read_dir(&tmp) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if leftover_owner(&name).is_some_and(|pid| !pid_alive(pid)) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod shell_tests {
    use super::run;

    #[test]
    fn commands_keep_their_words_output_and_failures() {
        assert_eq!(run("printf", &["%s|", "a 'b' c", "", "$HOME"]).unwrap(), "a 'b' c||$HOME|");
        let err = run("sh", &["-c", "echo out; echo oops >&2; exit 3"]).unwrap_err().to_string();
        assert!(err.contains("exit status 3") && err.contains("oops"), "{err}");
        assert_eq!(run("echo", &["still", "serving"]).unwrap(), "still serving\n");
    }
}
