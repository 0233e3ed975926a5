//! A connection flood against the daemon's metrics port, from an unprivileged user as a hostile
//! neighbour would make it: Debian's python3 run as `nobody` through util-linux's `setpriv`,
//! opening real TCP connections and holding them until dropped.
use std::{
    io::{BufRead, BufReader},
    process::{Child, ChildStdin, Command, Stdio},
};

/// Opens COUNT connections to HOST:PORT (each sending the start of a request's headers when
/// MODE is `partial`, so that the server reads and buffers something), says how many it
/// holds, and holds them until its stdin closes.
const FLOOD: &str = r#"
import resource, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
host, port, count, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
held, failed = [], 0
for _ in range(count):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        if mode == "partial":
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        held.append(s)
    except OSError:
        failed += 1
        s.close()
print(f"held {len(held)} failed {failed}", flush=True)
sys.stdin.read()
"#;

/// Connections held; closed (every one of them) when dropped.
pub struct Flood {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Connections the kernel completed (the daemon may have closed them since).
    pub held: u64,
    /// Connections that could not be made within 3 s each.
    pub failed: u64,
}

impl Flood {
    /// `count` connections to `addr` (`HOST:PORT`) as user nobody; returns once all were tried.
    pub fn start(addr: &str, count: u32, partial: bool) -> Flood {
        let (host, port) = addr.rsplit_once(':').expect("HOST:PORT");
        let mut child = Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .args(["/usr/bin/python3", "-c", FLOOD, host, port])
            .arg(count.to_string())
            .arg(if partial { "partial" } else { "silent" })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("running setpriv and /usr/bin/python3 (util-linux, python3)");
        let stdin = child.stdin.take();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let numbers: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let [held, failed] = numbers[..] else {
            panic!("the flood said {line:?}, not `held N failed M`");
        };
        assert_eq!(
            nix::unistd::Uid::from_raw(
                std::fs::read_to_string(format!("/proc/{}/status", child.id()))
                    .unwrap()
                    .lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                    .unwrap()
            ),
            nix::unistd::User::from_name("nobody")
                .unwrap()
                .expect("a user nobody")
                .uid,
            "the flood must come from an unprivileged user"
        );
        Flood {
            child,
            stdin,
            held,
            failed,
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
