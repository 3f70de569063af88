//! Directory listings on the mount, and the positions `readdir` hands out.
//!
//! The kernel goes on reading a directory from the position (offset) of the
//! last entry it was given, and a directory may change between two reads:
//! `rm -rf`, or any loop that unlinks what it reads, lists a directory
//! while it empties it. Positions that count entries then shift with every
//! removal, and names that were there all along are skipped or repeated.
//! So an entry's position here is its *cookie*, a hash of its name alone:
//! the same whatever else the directory holds, and across a rebase. A
//! listing runs in cookie order and goes on after the cookie it is given,
//! as in ext4's hashed directories; names added or removed meanwhile may
//! or may not be listed, as POSIX allows, and every other name is listed
//! once. Cookies 0, 1 and 2 are the start, `.` and `..`.
//!
//! The cookie is 62 bits of xxh3, seeded afresh by each daemon, so two
//! names of one directory share one with a chance of about n²/2⁶³ (and
//! cannot be chosen to); a listing that stops between two such names
//! would skip the second. The order of a listing differs from one daemon
//! to the next.

use std::collections::BTreeMap;

use super::ino::Ino;

/// The cookie of `.`, the first entry.
pub const DOT: u64 = 1;
/// The cookie of `..`.
pub const DOTDOT: u64 = 2;

/// The position of the entry `name` in its directory's listing (never
/// 0, [`DOT`] or [`DOTDOT`], and below 2⁶³: the kernel takes it as a
/// signed file offset).
pub fn cookie(name: &str) -> u64 {
    3 + (xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), seed()) >> 2)
}

/// The hash's seed, drawn once per process: positions need only hold
/// while this daemon serves (a directory handle does not outlive it, and
/// a rebase keeps it), and a seed no one knows keeps a process on the
/// mount from making two names share a position, so that a listing
/// would skip one, on purpose.
fn seed() -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u64))
}

/// The listing of a directory that differs from its lower one (or has
/// none): its names, by name and in cookie order.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    names: BTreeMap<Box<str>, Ino>,
    /// The same, keyed by cookie (and name, should two share one).
    order: BTreeMap<(u64, Box<str>), Ino>,
}

impl Listing {
    /// The inode `name` names.
    pub fn get(&self, name: &str) -> Option<&Ino> {
        self.names.get(name)
    }

    /// Whether `name` is in the listing.
    pub fn contains_key(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// Makes `name` name `ino`; returns the inode it named before.
    pub fn insert(&mut self, name: Box<str>, ino: Ino) -> Option<Ino> {
        self.order.insert((cookie(&name), name.clone()), ino);
        self.names.insert(name, ino)
    }

    /// Removes `name`; returns the inode it named.
    pub fn remove(&mut self, name: &str) -> Option<Ino> {
        let old = self.names.remove(name)?;
        self.order.remove(&(cookie(name), name.into()));
        Some(old)
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are no names.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The names and their inodes, in name order.
    pub fn iter(&self) -> std::collections::btree_map::Iter<'_, Box<str>, Ino> {
        self.names.iter()
    }

    /// The entries after position `after`, in cookie order: `(cookie,
    /// name, inode)`.
    pub fn after(&self, after: u64) -> impl Iterator<Item = (u64, &str, Ino)> + '_ {
        let from = (after.saturating_add(1), Box::<str>::default());
        self.order
            .range(from..)
            .map(|((c, name), ino)| (*c, &**name, *ino))
    }
}

impl FromIterator<(Box<str>, Ino)> for Listing {
    fn from_iter<I: IntoIterator<Item = (Box<str>, Ino)>>(iter: I) -> Listing {
        let mut l = Listing::default();
        for (name, ino) in iter {
            l.insert(name, ino);
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(l: &Listing, after: u64) -> Vec<String> {
        l.after(after).map(|(_, n, _)| n.to_owned()).collect()
    }

    #[test]
    fn a_listing_goes_on_after_its_cookie_whatever_else_changed() {
        let mut l: Listing = (0..1000)
            .map(|i| (format!("f{i}").into(), i + 10))
            .collect();
        let all = names(&l, DOTDOT);
        assert_eq!(all.len(), 1000);
        // Read 100, remove what was read and add new names, read on from
        // the last cookie: every name there all along is read once.
        let (first, rest) = all.split_at(100);
        let last = cookie(first.last().unwrap());
        for n in first {
            assert!(l.remove(n).is_some());
        }
        for i in 0..500 {
            l.insert(format!("new{i}").into(), 5000 + i);
        }
        let next = names(&l, last);
        for n in rest {
            assert_eq!(next.iter().filter(|m| *m == n).count(), 1, "{n}");
        }
        assert!(first.iter().all(|n| !next.contains(n)));
        // Cookies keep clear of the start, `.` and `..`, and of the sign bit.
        assert!(
            l.after(0)
                .all(|(c, n, _)| c > DOTDOT && c < 1 << 63 && c == cookie(n))
        );
        // Two names not read above (which ones depends on the seed).
        let ino_of = |n: &str| n[1..].parse::<u64>().unwrap() + 10;
        let (a, b) = (&*rest[0], &*rest[1]);
        assert_eq!(l.get(a), Some(&ino_of(a)));
        assert_eq!(l.remove(a), Some(ino_of(a)));
        assert_eq!(l.remove(a), None);
        assert!(!names(&l, 0).contains(&a.to_owned()));
        assert_eq!(l.len(), 1000 - 100 - 1 + 500);
        // A name given another inode (a rename over it) lists with it.
        assert_eq!(l.insert(b.into(), 99), Some(ino_of(b)));
        assert!(l.after(0).any(|(_, n, i)| n == b && i == 99));
        assert_eq!(l.len(), 1000 - 100 - 1 + 500);
    }
}
