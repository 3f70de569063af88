//! The walk of the merged view a seal writes: pack's exclusion step
//! ([`ScanReport::classify`]) over the mount's entries, in path order.

use super::*;

impl Overlay {
    /// Walks the merged view (both parts, whichever is mounted), applying
    /// the policy, in path order.
    pub(super) fn collect(
        &self,
        opts: &SealOptions,
        policy: &Policy,
    ) -> Result<(Vec<Item>, ScanReport)> {
        let st = self.state.read_recursive();
        let lower = &*st.lower;
        let mut items = Vec::new();
        let mut report = ScanReport::default();
        let mut stack: Vec<(Ino, String, Part, usize)> = Vec::new();
        let mut linked_out = Vec::new();
        let mut credential_dirs = Vec::new();
        for &r in lower.index.roots() {
            let path = lower.manifest().entries[r as usize].path.to_string();
            let Some(part) = Part::parse(&path) else {
                continue;
            };
            items.push(Item {
                path: path.clone(),
                ino: lower.ino(r),
                kind: ItemKind::Dir,
                origin: Some(r),
            });
            stack.push((lower.ino(r), path, part, 0));
        }
        crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Collecting);
        while let Some((dir, dpath, part, depth)) = stack.pop() {
            let list = st.list(lower, dir)?;
            let kinds: Vec<(Kind, Ino)> = list
                .iter()
                .map(|(_, ino)| (st.kind(lower, *ino).unwrap_or(Kind::File), *ino))
                .collect();
            let typed: Vec<(&str, EntryType)> = list
                .iter()
                .zip(&kinds)
                .map(|((name, _), (k, _))| (&**name, entry_type(*k)))
                .collect();
            let verdicts = judge(policy, part, &dpath, &typed);
            for (((name, _), (kind, ino)), verdict) in list.iter().zip(&kinds).zip(verdicts) {
                let path = format!("{dpath}/{name}");
                match report
                    .classify(&path, entry_type(*kind), verdict, &opts.limits)
                    .map_err(refusal)?
                {
                    Step::Take => {}
                    Step::LeftOut => continue,
                    Step::CredentialFile => {
                        linked_out.push((*ino, path));
                        continue;
                    }
                    Step::CredentialDir => {
                        credential_dirs.push((*ino, path));
                        continue;
                    }
                }
                let r = st.get(lower, *ino).ok_or(Error::NotFound)?;
                let origin = match r {
                    Ref::Node(n) => n.lower,
                    Ref::Lower(i) => Some(i),
                };
                match kind {
                    Kind::Dir => {
                        items.push(Item {
                            path: path.clone(),
                            ino: *ino,
                            kind: ItemKind::Dir,
                            origin,
                        });
                        stack.push((*ino, path, part, depth + 1));
                    }
                    Kind::Symlink => {
                        let target = match r {
                            Ref::Node(n) => crate::overlay::target_of(lower, n).to_string(),
                            Ref::Lower(i) => match &lower.manifest().entries[i as usize].kind {
                                EntryKind::Symlink(t) => t.to_string(),
                                _ => String::new(),
                            },
                        };
                        let spellings = opts.roots.get(&part).map_or(&[][..], Vec::as_slice);
                        let stored = match report.symlink(
                            &path,
                            &target,
                            depth,
                            spellings,
                            part,
                            opts.reject_external_symlinks,
                        ) {
                            Ok(stored) => stored,
                            Err(reason) => {
                                return Err(Error::Refused {
                                    path,
                                    kind: crate::packet::error::ErrorKind::ExternalSymlink,
                                    reason,
                                });
                            }
                        };
                        let rewritten = stored != target;
                        items.push(Item {
                            path,
                            ino: *ino,
                            kind: ItemKind::Symlink(stored, rewritten),
                            origin,
                        });
                    }
                    Kind::File => {
                        let f = self.file_item(lower, r, &path, &mut report)?;
                        items.push(Item {
                            path,
                            ino: *ino,
                            kind: ItemKind::File(f),
                            origin,
                        });
                    }
                    // (Special files: dropped and reported by `classify`.)
                    Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev => {}
                }
            }
        }
        // The files with other names in a directory left out as holding
        // credentials (`ln .ssh/id_ed25519 key.txt` on the mount): a
        // packet has no hard links, so only files made or linked on the
        // mount (nodes) can have them.
        while let Some((dir, dpath)) = credential_dirs.pop() {
            for (name, ino) in st.list(lower, dir)? {
                let path = format!("{dpath}/{name}");
                match st.get(lower, ino) {
                    Some(Ref::Node(n)) if n.kind == Kind::File && n.nlink > 1 => {
                        linked_out.push((ino, path));
                    }
                    Some(Ref::Node(n)) if n.kind == Kind::Dir => credential_dirs.push((ino, path)),
                    Some(Ref::Lower(i)) if lower.kind(i) == Kind::Dir => {
                        credential_dirs.push((ino, path));
                    }
                    _ => {}
                }
            }
        }
        // An excluded file's other names (hard links made on the mount).
        report.exclude_other_names(&mut items, linked_out, |it| match it.kind {
            ItemKind::File(_) => Some((it.ino, it.path.as_str())),
            _ => None,
        });
        items.sort_unstable_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        Ok((items, report))
    }

    /// What a seal takes from one file of the merged view.
    fn file_item(
        &self,
        lower: &Lower,
        r: Ref<'_>,
        path: &str,
        report: &mut ScanReport,
    ) -> Result<FileItem> {
        let m = lower.manifest();
        let lower_file = |i: Idx| m.entries[i as usize].file();
        let mut chunks = None;
        let (from, reuse, origin, size, mtime, perm) = match r {
            Ref::Lower(i) => {
                let f = lower_file(i).ok_or(Error::NotFound)?;
                let perm = if f.executable { 0o755 } else { 0o644 };
                (
                    Source::Lower(i),
                    Some(i),
                    Some(i),
                    f.size,
                    f.mtime_ns as i64,
                    perm,
                )
            }
            Ref::Node(n) => match n.content {
                Content::Lower(i) => {
                    let f = lower_file(i).ok_or(Error::NotFound)?;
                    (Source::Lower(i), Some(i), n.lower, f.size, n.mtime, n.perm)
                }
                Content::Upper(id) => {
                    let st = self.upper.stat_data(id)?;
                    let mtime = crate::overlay::stat_nanos(st.st_mtime, st.st_mtime_nsec);
                    let size = st.st_size as u64;
                    // A copy-up nothing wrote to since holds the lower bytes.
                    match n.lower.filter(|_| !n.modified.get()) {
                        Some(i) if lower_file(i).is_some_and(|f| f.size == size) => {
                            (Source::Lower(i), Some(i), Some(i), size, mtime, n.perm)
                        }
                        _ => {
                            chunks = n.chunks.clone();
                            (Source::Upper(id), None, n.lower, size, mtime, n.perm)
                        }
                    }
                }
                Content::None => return Err(Error::NotFound),
            },
        };
        let clamped = mtime.clamp(0, MAX_MTIME_NS.min(i64::MAX as u64) as i64);
        if clamped != mtime {
            report.clamped_mtimes.push(Clamped {
                path: path.into(),
                mtime_ns: mtime.to_string(),
                recorded_ns: clamped as u64,
            });
        }
        Ok(FileItem {
            from,
            reuse,
            origin,
            size,
            mtime_ns: clamped as u64,
            executable: perm & 0o111 != 0,
            chunks,
        })
    }
}

/// The type pack would see of an entry of kind `k`.
fn entry_type(k: Kind) -> EntryType {
    match k {
        Kind::Dir => EntryType::Dir,
        Kind::File => EntryType::File,
        Kind::Symlink => EntryType::Symlink,
        Kind::Fifo => EntryType::Fifo,
        Kind::Socket => EntryType::Socket,
        Kind::CharDev => EntryType::CharDevice,
        Kind::BlockDev => EntryType::BlockDevice,
    }
}

/// What the merged view breaks (packet rules, limits, symlinks leaving
/// their part): refused input.
pub(super) fn refusal(e: crate::source::Error) -> Error {
    match e {
        crate::source::Error::Refused { path, kind, reason } => {
            Error::Refused { path, kind, reason }
        }
        crate::source::Error::Packet(p) => Error::Packet(p),
        other => Error::Refused {
            path: other.path().unwrap_or_default().to_string(),
            kind: other.kind(),
            reason: other.to_string(),
        },
    }
}
