//! A real PostgreSQL 15 server (Debian's `postgresql-15` package, installed by .ci/run) in a
//! real Docker container. The cluster is made with `initdb` once per test run, as the host's
//! `postgres` user; every server gets its own copy of it, bind-mounted at /pgdata, and runs
//! under postgres' uid:gid with the host's /usr, /lib and /lib64 mounted read-only. The
//! container is removed, and its data directory deleted, when the handle drops.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
    time::{Duration, Instant},
};

use crate::{docker::Container, tempdir};

/// Where Debian's postgresql-15 package puts the server and its tools.
pub const BIN: &str = "/usr/lib/postgresql/15/bin";
/// The data directory (and socket directory) inside the container.
pub const DATA: &str = "/pgdata";

/// Settings that make the planner choose a parallel plan even on a small table, so a test's
/// query makes parallel workers and dynamic shared memory (/dev/shm/PostgreSQL.N).
pub const FORCE_PARALLEL: &str = "SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; \
     SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 4;";

fn run(command: &mut Command, what: &str) -> Output {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A fresh temporary directory (made 0700, as `tempdir` makes them) that the postgres user
/// may pass through to the cluster inside it, which it owns.
fn traversable_tempdir() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    dir
}

/// The host's postgres user and group ids: the server runs as them in the container.
fn postgres_ids() -> (u32, u32) {
    let user = nix::unistd::User::from_name("postgres")
        .expect("reading /etc/passwd")
        .expect("no postgres user: apt-get install postgresql-15 (as .ci/run does)");
    (user.uid.as_raw(), user.gid.as_raw())
}

/// A cluster made once per test run, copied for every server.
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let initdb = Path::new(BIN).join("initdb");
        assert!(
            initdb.exists(),
            "{} is missing: apt-get install postgresql-15 (as .ci/run does)",
            initdb.display()
        );
        let (uid, gid) = postgres_ids();
        let dir = traversable_tempdir().join("pg-template");
        std::fs::create_dir(&dir).unwrap();
        nix::unistd::chown(&dir, Some(uid.into()), Some(gid.into())).unwrap();
        run(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&initdb)
                .args(["--locale=C", "--encoding=UTF8", "--auth=trust", "--no-sync"])
                .arg("-D")
                .arg(&dir),
            "initdb",
        );
        dir
    })
}

/// A running PostgreSQL server in a container; removed on drop.
pub struct Postgres {
    pub container: Container,
    data: PathBuf,
}

impl Postgres {
    /// Starts a server in a container named after `prefix`, with `docker_flags` (for example
    /// `--shm-size=1m`) and `settings` passed to the server as `-c NAME=VALUE`, and waits until
    /// it accepts connections.
    pub fn start(prefix: &str, docker_flags: &[&str], settings: &[&str]) -> Postgres {
        let (uid, gid) = postgres_ids();
        let data = traversable_tempdir().join("pgdata");
        run(
            Command::new("cp").arg("-a").arg(template()).arg(&data),
            "copying the PostgreSQL cluster",
        );
        let user = format!("{uid}:{gid}");
        let mount = format!("{}:{DATA}", data.display());
        let mut flags = vec![
            "--user",
            &user,
            "-v",
            &mount,
            "-v",
            "/etc/passwd:/etc/passwd:ro",
            "-v",
            "/etc/group:/etc/group:ro",
        ];
        flags.extend(docker_flags);
        let mut script = format!("exec {BIN}/postgres -D {DATA} -k {DATA} -c listen_addresses=");
        for setting in settings {
            script.push_str(" -c ");
            script.push_str(setting);
        }
        let container = Container::run(prefix, &flags, &script);
        let server = Postgres { container, data };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = self
                .container
                .exec(&[&format!("{BIN}/pg_isready"), "-q", "-h", DATA]);
            if ready.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "PostgreSQL in {} did not accept connections within 30 s; its log:\n{}",
                self.container.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `sql` with psql in the container (as the postgres user, over the Unix socket);
    /// psql stops at the first error (`ON_ERROR_STOP`), so a failed query fails the command.
    pub fn psql(&self, sql: &str) -> Output {
        self.container.exec(&[
            &format!("{BIN}/psql"),
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            DATA,
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
            sql,
        ])
    }

    /// Like `psql`, but fails the test unless the query succeeds; returns its output.
    pub fn query(&self, sql: &str) -> String {
        let output = self.psql(sql);
        assert!(
            output.status.success(),
            "psql failed on {sql:?}: {}\nserver log:\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.log()
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The server's log (its stderr, as `docker logs` has it).
    pub fn log(&self) -> String {
        let output = Command::new("docker")
            .args(["logs", &self.container.name])
            .output()
            .expect("running docker logs");
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr)
    }

    /// The postmaster's pid on the host.
    pub fn pid(&self) -> u32 {
        self.container.pid()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.container.name])
            .output();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
