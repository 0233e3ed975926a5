//! What differs between a guest of one architecture and another: Debian's name for it, the
//! Rust target its programs are built for, and how qemu boots it and hears from it.
use std::path::PathBuf;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// Debian's architecture name, as in package file names and `[arch=...]`.
    pub fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Aarch64 => "arm64",
        }
    }

    /// The kernel's and GNU's name for it (`uname -m`).
    pub fn gnu(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// The Rust target of its glibc programs.
    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-gnu",
            Arch::Aarch64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The Rust target the guest's programs are built for, when it is not the host's (the
    /// host is x86-64).
    pub fn cross_target(self) -> Option<&'static str> {
        match self {
            Arch::X86_64 => None,
            Arch::Aarch64 => Some("aarch64-unknown-linux-gnu"),
        }
    }

    /// Debian's multiarch directories, where its loader finds libraries with no cache.
    pub fn library_dirs(self) -> [&'static str; 2] {
        match self {
            Arch::X86_64 => ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"],
            Arch::Aarch64 => ["/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"],
        }
    }

    /// Docker's and the OCI's name for it (`--platform linux/...`, `TARGETARCH`).
    pub fn oci(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Aarch64 => "arm64",
        }
    }

    /// Where cargo puts the guest's programs of the debug profile.
    pub fn debug_dir(self, target_dir: &std::path::Path) -> PathBuf {
        match self.cross_target() {
            None => target_dir.join("debug"),
            Some(triple) => target_dir.join(triple).join("debug"),
        }
    }

    pub fn qemu(self) -> &'static str {
        match self {
            Arch::X86_64 => "qemu-system-x86_64",
            Arch::Aarch64 => "qemu-system-aarch64",
        }
    }

    /// The Debian package that has [`Arch::qemu`].
    pub fn qemu_package(self) -> &'static str {
        match self {
            Arch::X86_64 => "qemu-system-x86",
            Arch::Aarch64 => "qemu-system-arm",
        }
    }

    /// qemu's machine, under TCG (nested KVM does not work here, and an arm64 guest on an
    /// x86-64 host has no other way).
    pub fn machine_args(self) -> &'static [&'static str] {
        match self {
            Arch::X86_64 => &["-accel", "tcg,thread=multi", "-cpu", "max"],
            // `virt` with the newest CPU model; pointer authentication with qemu's own cheap
            // algorithm instead of the architected QARMA, which costs TCG dearly on every
            // function return of a kernel built with it (Debian's is).
            Arch::Aarch64 => &[
                "-accel",
                "tcg,thread=multi",
                "-M",
                "virt",
                "-cpu",
                "max,pauth-impdef=on",
            ],
        }
    }

    /// The kernel's console device.
    pub fn console(self) -> &'static str {
        match self {
            Arch::X86_64 => "ttyS0",
            Arch::Aarch64 => "ttyAMA0",
        }
    }

    /// The device the guest writes its results to. A PC has a second serial port, kept for
    /// results alone; the `virt` board has one UART, so results go to the console, between
    /// markers, with the kernel's own messages hushed (`guest::init_script`).
    pub fn results_device(self) -> &'static str {
        match self {
            Arch::X86_64 => "/dev/ttyS1",
            Arch::Aarch64 => "/dev/ttyAMA0",
        }
    }

    /// Tests left out of this architecture's guests because emulating it takes them past any
    /// time budget; what they test is the same code on every architecture, and the x86-64
    /// guests run them. Under TCG on x86-64, an arm64 guest starts 20 000 threads in more than
    /// the test's 8 minutes (an x86-64 guest: seconds).
    pub fn skipped_tests(self) -> &'static [&'static str] {
        match self {
            Arch::X86_64 => &[],
            Arch::Aarch64 => &["threads_that_ended_leave_no_slot_behind"],
        }
    }

    pub fn results_on_console(self) -> bool {
        self.results_device() == format!("/dev/{}", self.console())
    }
}
