//! Benchmark corpora, generated deterministically from a seed.
//!
//! - **S**: a source tree: nested directories, text files whose sizes follow
//!   the size histogram of a real code tree, and a `.git` made by git itself.
//! - **B**: a few large files of incompressible bytes.
//! - **M**: many entries (the default entry limit), mostly tiny files.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// splitmix64: small, fast, and the same on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// File sizes of a real code tree (the 12,470 files of the crates this
/// project builds against, as unpacked in ~/.cargo/registry/src, measured on
/// 2026-12-02): per mille of files whose size is in [2^(k-1), 2^k), for
/// k = 1..=21. Sizes of 256 KiB and more (k >= 19, 0.9% of files) are left
/// out, and sizes are halved, so that 100,000 files and their git
/// repository come to about 1 GiB, as the benchmark wants.
const SIZE_HISTOGRAM: [(u32, u32); 18] = [
    (1, 3),
    (3, 16),
    (4, 2),
    (5, 11),
    (6, 13),
    (7, 35),
    (8, 43),
    (9, 54),
    (10, 80),
    (11, 107),
    (12, 159),
    (13, 157),
    (14, 133),
    (15, 78),
    (16, 53),
    (17, 31),
    (18, 21),
    (2, 1),
];

fn draw_size(rng: &mut Rng) -> u64 {
    let total: u32 = SIZE_HISTOGRAM.iter().map(|(_, w)| w).sum();
    let mut pick = rng.below(u64::from(total)) as u32;
    for (k, w) in SIZE_HISTOGRAM {
        if pick < w {
            let lo = 1u64 << (k - 1);
            return (lo + rng.below(lo)) / 2;
        }
        pick -= w;
    }
    1
}

const WORDS: &[&str] = &[
    "fn", "let", "mut", "impl", "struct", "enum", "match", "self", "return", "pub", "use", "mod",
    "if", "else", "for", "while", "loop", "Result", "Option", "Vec", "String", "u64", "usize",
    "&str", "Ok", "Err", "Some", "None", "config", "buffer", "index", "entry", "path", "value",
    "count", "error", "handle", "request", "reply", "inode", "offset", "length", "packet",
    "manifest", "=", "==", "=>", "->", "{", "}", "(", ")", ";", ",", ".", "::", "//", "0", "1",
    "42", "true", "false",
];

/// Fills `out` with `size` bytes of source-like text.
fn text(rng: &mut Rng, size: u64, out: &mut Vec<u8>) {
    out.clear();
    while (out.len() as u64) < size {
        let w = WORDS[rng.below(WORDS.len() as u64) as usize];
        out.extend_from_slice(w.as_bytes());
        out.push(if rng.below(9) == 0 { b'\n' } else { b' ' });
    }
    out.truncate(size as usize);
}

fn set_mtime(path: &Path, secs: i64) {
    use nix::sys::stat::{UtimensatFlags, utimensat};
    use nix::sys::time::TimeSpec;
    let t = TimeSpec::new(secs, 0);
    let _ = utimensat(
        nix::fcntl::AT_FDCWD,
        path,
        &t,
        &t,
        UtimensatFlags::NoFollowSymlink,
    );
}

/// Corpus S: `files` source files in nested directories, then a git
/// repository of them.
pub fn source_tree(root: &Path, files: u64, seed: u64) -> std::io::Result<()> {
    let mut rng = Rng::new(seed);
    fs::create_dir_all(root)?;
    let mut dirs: Vec<String> = vec![String::new()];
    let mut buf = Vec::new();
    for i in 0..files {
        // About 12 files per directory, at most 8 levels deep.
        if i % 12 == 0 {
            let parent = dirs[rng.below(dirs.len() as u64) as usize].clone();
            let depth = parent.matches('/').count();
            let name = format!(
                "{}m{}",
                if depth < 8 { parent } else { String::new() },
                dirs.len()
            );
            fs::create_dir_all(root.join(&name))?;
            dirs.push(format!("{name}/"));
        }
        let dir = &dirs[rng.below(dirs.len() as u64) as usize];
        let ext = ["rs", "py", "ts", "c", "h", "md", "json", "toml"][rng.below(8) as usize];
        let path = root.join(format!("{dir}f{i}.{ext}"));
        let size = draw_size(&mut rng);
        text(&mut rng, size, &mut buf);
        fs::File::create(&path)?.write_all(&buf)?;
        set_mtime(&path, 1_700_000_000 + (rng.below(30_000_000) as i64));
    }
    let git = |args: &[&str]| -> std::io::Result<()> {
        let st = Command::new("git")
            .args([
                "-c",
                "user.name=bench",
                "-c",
                "user.email=bench@example.com",
                "-c",
                "gc.auto=0",
            ])
            .args(args)
            .current_dir(root)
            .stdout(std::process::Stdio::null())
            .status()?;
        if st.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("git {args:?} failed")))
        }
    };
    git(&["init", "-q"])?;
    git(&["add", "-A"])?;
    git(&["commit", "-q", "-m", "corpus"])?;
    git(&["repack", "-a", "-d", "-q"])?;
    git(&["prune-packed"])?;
    git(&["status", "--short"])?; // refresh the index once, as a user would have
    Ok(())
}

/// Corpus B: `count` files of `size` bytes each.
pub fn big_files(root: &Path, count: u64, size: u64, seed: u64) -> std::io::Result<()> {
    let mut rng = Rng::new(seed);
    fs::create_dir_all(root)?;
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..count {
        let path = root.join(format!("big{i}.bin"));
        let mut f = fs::File::create(&path)?;
        let mut left = size;
        while left > 0 {
            for w in buf.chunks_mut(8) {
                let v = rng.next().to_le_bytes();
                w.copy_from_slice(&v[..w.len()]);
            }
            let n = left.min(buf.len() as u64) as usize;
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
        set_mtime(&path, 1_700_000_000 + i as i64);
    }
    Ok(())
}

/// Corpus M: `entries` entries in all: directories of 25 entries, files of
/// 0 to 2 KiB.
pub fn many_entries(root: &Path, entries: u64, seed: u64) -> std::io::Result<()> {
    let mut rng = Rng::new(seed);
    fs::create_dir_all(root)?;
    let mut buf = Vec::new();
    let mut made = 1; // the root itself is an entry
    let mut dir = String::new();
    let mut d = 0;
    while made < entries {
        if made % 25 == 1 {
            dir = format!("d{}/e{}", d / 100, d);
            fs::create_dir_all(root.join(&dir))?;
            made += if d % 100 == 0 { 2 } else { 1 };
            d += 1;
            continue;
        }
        let path = root.join(format!("{dir}/f{made}"));
        let size = rng.below(2048);
        text(&mut rng, size, &mut buf);
        fs::write(&path, &buf)?;
        set_mtime(&path, 1_700_000_000 + made as i64);
        made += 1;
    }
    Ok(())
}
