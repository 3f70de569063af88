//! How much memory this process may use (physical memory, cgroup and
//! address-space limits), and glibc's allocator fitted to an address-space
//! limit: read from /proc and /sys on Linux, kept apart from the system
//! call wrappers in `sys`.

use std::path::Path;

/// Whether the kernel started this process through an ELF interpreter (the
/// dynamic loader), as it does a dynamically linked program run by its
/// path: the auxiliary vector's `AT_BASE` is then where the loader sits,
/// and 0 when the loader itself was run as the program.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn started_through_interpreter() -> bool {
    const AT_BASE: usize = 7;
    const WORD: usize = std::mem::size_of::<usize>();
    let Ok(aux) = std::fs::read("/proc/self/auxv") else {
        return false;
    };
    aux.chunks_exact(2 * WORD).any(|pair| {
        let word = |b: &[u8]| usize::from_ne_bytes(b.try_into().unwrap_or([0; WORD]));
        word(&pair[..WORD]) == AT_BASE && word(&pair[WORD..]) != 0
    })
}

/// Under an address-space limit (`ulimit -v`), starts this program again
/// with glibc's malloc kept to two arenas (`MALLOC_ARENA_MAX=2`), unless
/// that variable is set already; returns where nothing is to be done or
/// the new start failed. glibc gives each thread that allocates an arena
/// of its own, up to eight per core, and each arena reserves 64 MiB of
/// address space: a pack of 60 MB under `ulimit -v 300000` died in an
/// allocation (an abort, with no result) while using a fraction of that.
/// glibc reads the variable only when a program starts, hence the second
/// start (`mallopt` would need unsafe code). Without a limit nothing
/// changes: more arenas, less waiting for one. Call before anything else.
pub fn fit_malloc_to_address_space() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit};
        use std::os::unix::process::CommandExt;
        let limited = getrlimit(Resource::RLIMIT_AS).is_ok_and(|(soft, _)| soft != RLIM_INFINITY);
        if !limited || std::env::var_os("MALLOC_ARENA_MAX").is_some() {
            return;
        }
        if !started_through_interpreter() {
            // Run as `ld-linux.so PROGRAM ...`, this process's executable
            // is the loader, which would take the first argument for the
            // program to run.
            return;
        }
        let mut args = std::env::args_os();
        // The very file running now, even where its path was replaced or
        // removed since (an upgrade in place).
        let mut again = std::process::Command::new("/proc/self/exe");
        if let Some(name) = args.next() {
            again.arg0(name);
        }
        // Returns only if the start failed.
        let _ = again.args(args).env("MALLOC_ARENA_MAX", "2").exec();
    }
}

/// The memory this process may use, at most: the machine's physical
/// memory, or less where its cgroup (v2 `memory.max`, v1
/// `memory.limit_in_bytes`) sets a lower limit, as in a pod, or where its
/// address space is limited (`ulimit -v`, which every mapping counts
/// against: code, thread stacks, the allocator's arenas).
pub fn memory_limit() -> u64 {
    let address_space = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_AS)
        .map_or(u64::MAX, |(soft, _)| soft);
    physical_or_cgroup_limit().min(address_space)
}

fn physical_or_cgroup_limit() -> u64 {
    let phys = super::platform::physical_memory();
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    cgroups
        .lines()
        .flat_map(cgroup_memory_limits)
        .fold(phys, u64::min)
}

/// The memory limits that bind the cgroup of one `/proc/self/cgroup` line
/// (v2 `0::PATH`, or a v1 line whose controllers include `memory`): of the
/// cgroup and of each parent, up to the root of the mounted hierarchy. The
/// walk up also finds the limit where `PATH` is not below the mount (a
/// container without a cgroup namespace sees its host's path, but has its
/// own cgroup mounted at the root).
fn cgroup_memory_limits(line: &str) -> Vec<u64> {
    let mut f = line.splitn(3, ':');
    let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
        return Vec::new();
    };
    let (base, file) = if controllers.is_empty() {
        ("/sys/fs/cgroup", "memory.max")
    } else if controllers.split(',').any(|c| c == "memory") {
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
    } else {
        return Vec::new();
    };
    let mut dir = Path::new(base).join(path.trim_start_matches('/'));
    let mut out = Vec::new();
    loop {
        // "max" (v2) or a huge number (v1) where there is no limit.
        if let Some(n) = std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
        {
            out.push(n);
        }
        if dir == Path::new(base) || !dir.pop() {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_lines_without_a_memory_limit_give_none() {
        for line in [
            "",
            "garbage",
            "4:cpu,cpuacct:/x",
            "1:name=systemd:/",
            "0::/../../..",
            "0::/no/such/group",
            "7:memory:/../no/such",
        ] {
            let limits = cgroup_memory_limits(line);
            // Only a real limit file on the way up counts; there is none
            // under these names, but the roots may hold one.
            assert!(limits.len() <= 1, "{line}: {limits:?}");
        }
        assert!(memory_limit() > 0);
    }
}
