//! `cargo xtask setup`: make sure the native build prerequisites exist.
//!
//! librocksdb-sys compiles RocksDB's C++ (needs a C++ compiler) and generates
//! its bindings with bindgen (needs libclang, plus clang's builtin headers such
//! as stddef.h). On Debian/Ubuntu we install what is missing with apt-get, as
//! root or through passwordless sudo; elsewhere we say what to install.
//!
//! LATCHKEY_SKIP_SETUP=1 skips these checks (for unusual toolchain layouts).
//!
//! Also here: the Python environment of `cargo xtask test`'s python step
//! ([`python_venv`]), a virtualenv next to the target directory with grpcio.

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::run::{self, Exit, Result};

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Before another subcommand: print nothing when everything is present.
    Quiet,
    /// `cargo xtask setup`: report what was found.
    Verbose,
    /// `cargo xtask setup --check`: report, never install; fail if missing.
    Check,
}

/// A prerequisite that was not found.
struct Missing {
    what: &'static str,
    why: String,
    debian_package: &'static str,
    elsewhere: &'static str,
}

pub fn ensure(mode: Mode) -> Result {
    if env::var_os("LATCHKEY_SKIP_SETUP").is_some_and(|v| !v.is_empty() && v != "0") {
        if mode != Mode::Quiet {
            println!("xtask: LATCHKEY_SKIP_SETUP is set; not checking build prerequisites");
        }
        return Ok(());
    }
    let debian = is_debian_like();
    let missing = detect(mode, debian);
    if missing.is_empty() {
        if mode != Mode::Quiet {
            println!("xtask: all build prerequisites are present");
        }
        return Ok(());
    }

    for m in &missing {
        eprintln!("xtask: {} not found: {}", m.what, m.why);
    }
    let packages: Vec<&str> = missing.iter().map(|m| m.debian_package).collect();
    if mode == Mode::Check {
        return Err(Exit::with(1, manual_install_line(&missing, debian)));
    }
    if !debian {
        return Err(Exit::with(1, manual_install_line(&missing, debian)));
    }

    let Some(sudo) = apt_privilege() else {
        return Err(Exit::with(1, manual_install_line(&missing, debian)));
    };
    install_with_apt(&packages, sudo)?;

    let still_missing = detect(Mode::Quiet, debian);
    if still_missing.is_empty() {
        println!("xtask: build prerequisites installed");
        Ok(())
    } else {
        for m in &still_missing {
            eprintln!(
                "xtask: {} still not found after installing: {}",
                m.what, m.why
            );
        }
        Err(Exit::with(1, manual_install_line(&still_missing, debian)))
    }
}

/// Everything that is missing; in a verbose mode also print what was found.
fn detect(mode: Mode, debian: bool) -> Vec<Missing> {
    let mut missing = Vec::new();
    let report = |what: &str, found: &str| {
        if mode != Mode::Quiet {
            println!("xtask: {what}: {found}");
        }
    };

    match find_libclang() {
        Some(found) => {
            // A bare runtime library (Debian's libclang1-N) is not enough for
            // bindgen: it also needs clang's builtin headers, which come with
            // libclang-dev. Only checked where we know the layout.
            if debian && env::var_os("LIBCLANG_PATH").is_none() && !clang_headers_present() {
                missing.push(Missing {
                    what: "clang builtin headers",
                    why: format!("{found}, but no clang resource headers (stddef.h) for bindgen"),
                    debian_package: "libclang-dev",
                    elsewhere: "the libclang development package",
                });
            } else {
                report("libclang", &found);
            }
        }
        None => missing.push(Missing {
            what: "libclang",
            why: "bindgen needs it to build librocksdb-sys (set LIBCLANG_PATH if it is \
                  installed somewhere unusual)"
                .to_string(),
            debian_package: "libclang-dev",
            elsewhere: "libclang-dev on Debian/Ubuntu, clang-devel on Fedora, clang on Arch",
        }),
    }

    match find_cxx() {
        Some(found) => report("C++ compiler", &found),
        None => missing.push(Missing {
            what: "C++ compiler",
            why: "RocksDB is C++; none of c++, g++, clang++ runs (or set CXX)".to_string(),
            debian_package: "g++",
            elsewhere: "g++ on Debian/Ubuntu, gcc-c++ on Fedora",
        }),
    }
    missing
}

/// One line saying exactly what to install.
fn manual_install_line(missing: &[Missing], debian: bool) -> String {
    let whats: Vec<&str> = missing.iter().map(|m| m.what).collect();
    if debian {
        let mut packages: Vec<&str> = missing.iter().map(|m| m.debian_package).collect();
        packages.dedup();
        format!(
            "missing {}; install with: sudo apt-get install -y {}",
            whats.join(" and "),
            packages.join(" ")
        )
    } else {
        let hints: Vec<String> = missing
            .iter()
            .map(|m| format!("{} ({})", m.what, m.elsewhere))
            .collect();
        format!(
            "missing build prerequisites; please install: {}",
            hints.join("; ")
        )
    }
}

/// How apt-get can be run: `Some(false)` as root, `Some(true)` through
/// passwordless `sudo -n`, `None` not at all.
fn apt_privilege() -> Option<bool> {
    if is_root() {
        Some(false)
    } else if run::succeeds("sudo", &["-n", "true"]) {
        Some(true)
    } else {
        None
    }
}

fn install_with_apt(packages: &[&str], sudo: bool) -> Result {
    let mut packages: Vec<&str> = packages.to_vec();
    packages.dedup();
    println!(
        "xtask: installing {} with apt-get{} (one-time)",
        packages.join(" "),
        if sudo { " via sudo" } else { "" }
    );
    let apt = |args: &[&str]| {
        let mut cmd = if sudo {
            let mut c = Command::new("sudo");
            c.args(["-n", "env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]);
            c
        } else {
            let mut c = Command::new("apt-get");
            c.env("DEBIAN_FRONTEND", "noninteractive");
            c
        };
        cmd.args(args).stdin(Stdio::null());
        cmd
    };

    // A failing `update` (one broken third-party repository, no network for a
    // mirror...) is not fatal: the cached lists may still be good enough.
    if let Err(e) = run::run(&mut apt(&["update"])) {
        eprintln!(
            "xtask: warning: `apt-get update` failed (exit {}); trying the install anyway",
            e.code
        );
    }
    let mut install_args = vec!["install", "-y"];
    install_args.extend(&packages);
    run::run(&mut apt(&install_args)).map_err(|e| {
        Exit::with(
            e.code,
            format!(
                "`apt-get install -y {}` failed; please install it by hand",
                packages.join(" ")
            ),
        )
    })
}

// ---------------------------------------------------------------- Python

/// What the Python step of `cargo xtask test` needs to import...
const PYTHON_IMPORTS: &str =
    "import grpc, grpc_tools, grpc_reflection, pytest, setuptools, psycopg";
/// ... and the PyPI packages that provide it (no versions pinned): the
/// client package of clients/python is built with grpcio-tools and
/// setuptools, without build isolation, and tested with pytest; its
/// PostgreSQL fence is tested with psycopg (its binary build: no libpq to
/// install).
const PYTHON_PACKAGES: &[&str] = &[
    "grpcio",
    "grpcio-tools",
    "grpcio-reflection",
    "pytest",
    "setuptools",
    "psycopg[binary]",
];

/// The python of the virtualenv `venv`, ready for the Python step: the
/// virtualenv is made with `python3 -m venv` if it is missing (or has no
/// pip), and grpcio, grpcio-tools and grpcio-reflection are installed into
/// it with its pip (from PyPI, pip's default index) if they do not import.
/// Prints nothing when everything is there already.
///
/// On Debian/Ubuntu a missing python3 or venv module (package
/// python3-venv) is installed with apt-get as root or through passwordless
/// sudo, as for libclang; elsewhere the error says what to install.
pub fn python_venv(venv: &Path) -> Result<PathBuf> {
    let python = if cfg!(windows) {
        venv.join("Scripts").join("python.exe")
    } else {
        venv.join("bin").join("python")
    };
    if run::succeeds(&python, &["-c", PYTHON_IMPORTS]) {
        return Ok(python);
    }
    if !run::succeeds(&python, &["-m", "pip", "--version"]) {
        create_venv(venv)?;
    }

    let started = Instant::now();
    // A second time with --force-reinstall if they are installed as far as
    // pip knows but still do not import (a damaged virtualenv).
    for extra in [None, Some("--force-reinstall")] {
        let mut pip = Command::new(&python);
        pip.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(extra)
        .args(PYTHON_PACKAGES)
        .stdin(Stdio::null());
        println!("xtask: {}", run::display(&pip));
        run::run(&mut pip).map_err(|e| {
            Exit::with(
                e.code,
                format!(
                    "`{}` failed (exit {}): pip needs PyPI (or the index in PIP_INDEX_URL)",
                    run::display(&pip),
                    e.code
                ),
            )
        })?;
        if run::succeeds(&python, &["-c", PYTHON_IMPORTS]) {
            break;
        }
        if extra.is_some() {
            return Err(Exit::with(
                1,
                format!(
                    "pip installed {} but `{} -c \"{PYTHON_IMPORTS}\"` still fails",
                    PYTHON_PACKAGES.join(" "),
                    python.display()
                ),
            ));
        }
    }
    println!(
        "xtask: installed {} into {} in {}",
        PYTHON_PACKAGES.join(" "),
        venv.display(),
        run::fmt_duration(started.elapsed())
    );
    Ok(python)
}

/// Where `program` is on the PATH, if it is.
fn find_in_path(program: &str) -> Option<PathBuf> {
    env::var_os("PATH").and_then(|paths| {
        env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// A headless-capable Chromium for the status-page test: `chromium` on the
/// PATH, else Debian's `chromium` package installed with apt-get (as root or
/// through passwordless sudo).
pub fn chromium() -> Result<PathBuf> {
    if let Some(path) = env::var_os("LATCHKEY_CHROMIUM") {
        return Ok(path.into());
    }
    if let Some(path) = find_in_path("chromium") {
        return Ok(path);
    }
    let manual = "chromium not found (the browser step needs it); install it (on Debian: sudo \
                  apt-get install -y chromium), or set LATCHKEY_CHROMIUM to a Chromium binary";
    let Some(sudo) = is_debian_like().then(apt_privilege).flatten() else {
        return Err(Exit::with(1, manual));
    };
    install_with_apt(&["chromium"], sudo)?;
    find_in_path("chromium").ok_or_else(|| {
        Exit::with(
            1,
            "apt-get installed chromium but it is still not on the PATH".to_string(),
        )
    })
}

/// PostgreSQL's server programs (`initdb`, `postgres`) for the fencing
/// tests and the fenced demo, which start a throwaway server of their own:
/// found where latchkey-fence's `ScratchPostgres` looks (the newest
/// `/usr/lib/postgresql/<version>/bin`, else the PATH, or
/// LATCHKEY_POSTGRES_BINDIR), else Debian's `postgresql` package installed
/// with apt-get (as root or through passwordless sudo). Returns the
/// directory that holds them.
pub fn postgres() -> Result<PathBuf> {
    if let Some(dir) = find_postgres() {
        return Ok(dir);
    }
    let manual = "PostgreSQL's server programs (initdb, postgres) not found (the fencing tests \
                  and the fenced demo start a throwaway server); install them (on Debian: sudo \
                  apt-get install -y postgresql), or set LATCHKEY_POSTGRES_BINDIR to the \
                  directory that holds them";
    let Some(sudo) = is_debian_like().then(apt_privilege).flatten() else {
        return Err(Exit::with(1, manual));
    };
    install_with_apt(&["postgresql"], sudo)?;
    find_postgres().ok_or_else(|| {
        Exit::with(
            1,
            "apt-get installed postgresql but initdb and postgres are still not found".to_string(),
        )
    })
}

/// Where `initdb` and `postgres` both are, if anywhere we look.
fn find_postgres() -> Option<PathBuf> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = env::var_os("LATCHKEY_POSTGRES_BINDIR").map(PathBuf::from) {
        return has_both(&dir).then_some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = subdirs(Path::new("/usr/lib/postgresql"), |name| {
        name.parse::<u32>().is_ok()
    })
    .into_iter()
    .filter_map(|dir| {
        let version = dir.file_name()?.to_str()?.parse::<u32>().ok()?;
        Some((version, dir.join("bin")))
    })
    .filter(|(_, bin)| has_both(bin))
    .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let initdb = find_in_path("initdb")?;
    let dir = initdb.parent()?.to_path_buf();
    has_both(&dir).then_some(dir)
}

/// `python3 -m venv --clear VENV`, installing python3 and its venv module
/// first where we can (Debian/Ubuntu).
fn create_venv(venv: &Path) -> Result {
    let has_python = run::succeeds("python3", &["--version"]);
    // Debian splits venv's ensurepip (which puts pip in a new virtualenv)
    // into python3-venv.
    if !has_python || !run::succeeds("python3", &["-c", "import venv, ensurepip"]) {
        let (what, packages): (&str, &[&str]) = if has_python {
            ("python3's venv module (with ensurepip)", &["python3-venv"])
        } else {
            ("python3", &["python3", "python3-venv"])
        };
        let manual = if is_debian_like() {
            format!(
                "{what} not found; install with: sudo apt-get install -y {}",
                packages.join(" ")
            )
        } else {
            format!("{what} not found; please install Python 3 with its venv module (3.9 or newer)")
        };
        let sudo = if is_debian_like() {
            apt_privilege()
        } else {
            None
        };
        let Some(sudo) = sudo else {
            return Err(Exit::with(1, manual));
        };
        eprintln!("xtask: {what} not found (the Python step needs it)");
        install_with_apt(packages, sudo)?;
        if !run::succeeds("python3", &["-c", "import venv, ensurepip"]) {
            return Err(Exit::with(
                1,
                format!(
                    "{what} still not found after installing {}",
                    packages.join(" ")
                ),
            ));
        }
    }

    let started = Instant::now();
    let mut create = Command::new("python3");
    create
        .args(["-m", "venv", "--clear"])
        .arg(venv)
        .stdin(Stdio::null());
    println!("xtask: {}", run::display(&create));
    run::run(&mut create).map_err(|e| {
        Exit::with(
            e.code,
            format!("`{}` failed (exit {})", run::display(&create), e.code),
        )
    })?;
    println!(
        "xtask: created the virtualenv {} in {}",
        venv.display(),
        run::fmt_duration(started.elapsed())
    );
    Ok(())
}

// ---------------------------------------------------------------- libclang

/// Where libclang was found, or None.
fn find_libclang() -> Option<String> {
    if let Some(path) = env::var_os("LIBCLANG_PATH").filter(|p| !p.is_empty()) {
        let shown = Path::new(&path).display().to_string();
        if !Path::new(&path).exists() {
            eprintln!("xtask: warning: LIBCLANG_PATH={shown} does not exist; bindgen will fail");
        }
        return Some(format!("LIBCLANG_PATH={shown}"));
    }

    for ldconfig in ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"] {
        let Ok(out) = Command::new(ldconfig)
            .arg("-p")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
        else {
            continue;
        };
        if !out.status.success() {
            continue;
        }
        let listing = String::from_utf8_lossy(&out.stdout);
        let hit = listing.lines().find_map(|line| {
            let name = line.split_whitespace().next()?;
            is_libclang(name).then(|| line.rsplit("=> ").next().unwrap_or(name).trim())
        });
        if let Some(path) = hit {
            return Some(format!("{path} (ldconfig)"));
        }
        break;
    }

    let mut dirs: Vec<PathBuf> = Vec::new();
    for base in ["/usr/lib", "/usr/lib64"] {
        dirs.extend(
            subdirs(Path::new(base), |n| n.starts_with("llvm-"))
                .into_iter()
                .map(|d| d.join("lib")),
        );
    }
    for base in ["/usr/lib", "/lib"] {
        dirs.extend(subdirs(Path::new(base), |n| n.ends_with("-linux-gnu")));
    }
    dirs.extend(
        [
            "/usr/lib64",
            "/usr/lib",
            "/usr/local/lib",
            "/Library/Developer/CommandLineTools/usr/lib",
            "/opt/homebrew/opt/llvm/lib",
            "/usr/local/opt/llvm/lib",
        ]
        .map(PathBuf::from),
    );
    dirs.iter().find_map(|dir| {
        let entries = fs::read_dir(dir).ok()?;
        entries.flatten().find_map(|entry| {
            let name = entry.file_name();
            is_libclang(&name.to_string_lossy()).then(|| entry.path().display().to_string())
        })
    })
}

/// libclang.so, libclang.so.1, libclang-14.so, libclang-14.so.13, libclang.dylib;
/// not libclang-cpp.so, libclang_rt.*, libclangBasic.a.
fn is_libclang(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("libclang") else {
        return false;
    };
    if rest.starts_with(".so") || rest == ".dylib" {
        return true;
    }
    match rest.strip_prefix('-') {
        Some(versioned) => {
            versioned.starts_with(|c: char| c.is_ascii_digit())
                && (versioned.contains(".so") || versioned.ends_with(".dylib"))
        }
        None => false,
    }
}

/// clang's resource headers (what bindgen needs besides the library).
fn clang_headers_present() -> bool {
    let mut include_dirs: Vec<PathBuf> = Vec::new();
    for llvm in subdirs(Path::new("/usr/lib"), |n| n.starts_with("llvm-")) {
        include_dirs.extend(subdirs(&llvm.join("lib/clang"), |_| true));
    }
    for base in ["/usr/lib/clang", "/usr/lib64/clang", "/usr/include/clang"] {
        include_dirs.extend(subdirs(Path::new(base), |_| true));
    }
    include_dirs
        .iter()
        .any(|d| d.join("include/stddef.h").is_file())
}

/// The C++ compiler cc-rs will use. cc-rs runs `c++` unless CXX is set; when
/// only g++ or clang++ exists, export CXX so the builds we start find it.
fn find_cxx() -> Option<String> {
    if let Some(cxx) = env::var_os("CXX").filter(|v| !v.is_empty()) {
        return Some(format!("CXX={}", cxx.to_string_lossy()));
    }
    if run::succeeds("c++", &["--version"]) {
        return Some("c++".to_string());
    }
    for candidate in ["g++", "clang++"] {
        if run::succeeds(candidate, &["--version"]) {
            // Single-threaded at this point; children inherit it.
            env::set_var("CXX", candidate);
            return Some(format!("{candidate} (exported CXX={candidate})"));
        }
    }
    None
}

fn is_debian_like() -> bool {
    Path::new("/etc/debian_version").exists() && in_path("apt-get")
}

fn in_path(program: &str) -> bool {
    find_in_path(program).is_some()
}

fn is_root() -> bool {
    // Real uid from /proc (no libc dependency); `id -u` as the fallback.
    if let Ok(status) = fs::read_to_string("/proc/self/status") {
        if let Some(uid) = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|rest| rest.split_whitespace().next())
        {
            return uid == "0";
        }
    }
    Command::new("id")
        .arg("-u")
        .stderr(Stdio::null())
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The subdirectories of `parent` whose names satisfy `keep`, sorted by name
/// descending (so the newest llvm-N comes first). Unreadable means none.
fn subdirs(parent: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut dirs: Vec<(OsString, PathBuf)> = entries
        .flatten()
        .filter(|e| keep(&e.file_name().to_string_lossy()))
        .map(|e| (e.file_name(), e.path()))
        .filter(|(_, p)| p.is_dir())
        .collect();
    dirs.sort_by(|a, b| b.0.cmp(&a.0));
    dirs.into_iter().map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::is_libclang;

    #[test]
    fn libclang_names() {
        for yes in [
            "libclang.so",
            "libclang.so.1",
            "libclang-14.so",
            "libclang-14.so.13",
            "libclang-17.0.6.so",
            "libclang.dylib",
        ] {
            assert!(is_libclang(yes), "{yes}");
        }
        for no in [
            "libclang-cpp.so.14",
            "libclang_rt.asan.a",
            "libclangBasic.a",
            "libclang.a",
            "libclang-14",
            "clang",
        ] {
            assert!(!is_libclang(no), "{no}");
        }
    }
}
