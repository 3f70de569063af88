//! `--rebase`: the mount goes on serving the packet just sealed, with an
//! empty upper directory, without unmounting.

use super::*;
use std::collections::{HashMap, HashSet};

/// What a rebase moves onto: the file this seal committed, or the object
/// it uploaded.
pub(super) enum Placed<'a> {
    /// The packet file, as committed.
    File(&'a crate::output::Committed),
    /// The object at the seal's remote location.
    Remote(&'a super::RemoteSeal),
}

impl Overlay {
    /// Continues the mount on the packet just written at `output`, with an
    /// empty upper directory, without unmounting. Paths keep their inode
    /// numbers (but for the other names of a hard-linked file, which go to
    /// `moved.renumbered`), open files keep working. The commit point is one journal
    /// record: a crash before it re-mounts the old packet with the old
    /// changes, after it the new packet (see docs/upper-format.md). The
    /// file at `output` is first checked to be `written` (the file as
    /// committed, and its digest) and the new view built, all before that
    /// record; `moved.serves_new` is set once the mount serves the new packet (a
    /// failure says which, see [`Error::Rebase`]).
    pub(super) fn rebase_onto(
        &self,
        output: &std::path::Path,
        written: (Placed<'_>, Digest),
        items: &[Item],
        limits: &Limits,
        bar: Option<&std::path::Path>,
        moved: &mut Moved,
    ) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let t0 = std::time::Instant::now();
        let phase = |name: &str| {
            tracing::debug!(phase = name, ms = t0.elapsed().as_millis() as u64, "rebase")
        };
        let packet = match &written.0 {
            Placed::File(_) => crate::packet::reader::Packet::open(output, limits)?,
            Placed::Remote(remote) => self.open_uploaded(remote, limits)?,
        };
        phase("opened");
        // The file this seal wrote, as it left it: its chunks are trusted
        // below as written here, unverified.
        let refuse = |what: &str| Error::Refused {
            path: crate::packet::path::shown_path(output),
            kind: crate::packet::error::ErrorKind::PacketChanged,
            reason: format!(
                "was {what} after this seal wrote it; the mount moves only onto the file \
                 the seal wrote, as it wrote it"
            ),
        };
        // The object uploaded is the packet this seal wrote (its key was
        // free or held the same bytes: the upload completes only then);
        // the file, the one committed, as committed.
        let same = match &written.0 {
            Placed::File(c) => {
                let opened = packet.backing().local().and_then(|f| f.metadata().ok());
                let opened = opened.map(|m| (m.dev(), m.ino()));
                opened == Some((c.placed.dev(), c.placed.ino()))
            }
            Placed::Remote(_) => true,
        };
        if !same || packet.digest != written.1 {
            return Err(refuse("replaced"));
        }
        self.warm_uploaded(&packet, items);
        let digest = packet.digest;
        let (renumbered, mut given) = plan_numbers(items);
        // The new lower view, built before the record: nothing after the
        // record may fail but making it durable (rolled back if it fails)
        // and tidying the upper directory once the mount has moved.
        let given_map: hashbrown::HashMap<String, Ino> = given.iter().cloned().collect();
        // Numbers the kernel holds that no entry of the new packet has (an
        // entry removed while open or mapped, or whose `FORGET` has not come
        // yet; one the seal left out): their nodes live on in the new view,
        // in no directory, files on their own data files, until the kernel
        // forgets them. Their numbers go to no new entry meanwhile: the
        // kernel drops an inode whose number comes back with another
        // generation, failing its descriptors with `EIO`, and would count
        // its late `FORGET` against the new entry.
        let in_packet: HashSet<Ino> = items.iter().map(|it| it.ino).collect();
        // What the packet leaves out stays on the mount (see `left_out`).
        let left_out = self.left_out(items, &in_packet)?;
        let kept: HashSet<Ino> = left_out
            .iter()
            .map(|&(_, _, ino)| ino)
            .filter(|ino| !in_packet.contains(ino))
            .collect();
        let held: Vec<(Ino, Kind)> = {
            let st = self.state.read_recursive();
            st.kernel_refs()
                .into_iter()
                .filter(|(ino, _)| !in_packet.contains(ino) && !kept.contains(ino))
                .filter_map(|(ino, _)| Some((ino, st.kind(&st.lower, ino)?)))
                .collect()
        };
        let reserved: Vec<Ino> = held
            .iter()
            .map(|&(ino, _)| ino)
            .chain(kept.iter().copied())
            .collect();
        let (lower, inos) = crate::overlay::new_lower(packet, self.opts, &given_map, &reserved)?;
        // A renumbered name's new number depends on the numbers reserved
        // here, which a remount does not reserve: the record keeps it, so
        // that the journal replays to these very numbers.
        let mut new_numbers: HashMap<usize, Ino> = HashMap::new();
        for &k in &renumbered {
            let path = items[k].path.as_str();
            let at = lower
                .manifest()
                .entries
                .binary_search_by(|e| e.path.as_bytes().cmp(path.as_bytes()));
            if let Ok(i) = at {
                let ino = lower.ino(i as Idx);
                new_numbers.insert(k, ino);
                if crate::overlay::ino::candidate(path, 0) != ino {
                    given.push((path.to_owned(), ino));
                }
            }
        }
        given.sort();
        if let Placed::File(committed) = &written.0 {
            if !lower.verifier.opened_as(&lower.packet, committed) {
                return Err(refuse("modified"));
            }
            // Every chunk was verified or hashed as this daemon wrote it.
            lower.verifier.mark_all();
        }
        // (An uploaded packet's content is fetched, from the cache where it
        // is there, and verified as it is read, as at any remote mount.)
        let lower = Arc::new(lower);
        phase("indexed");
        let mut fresh = crate::overlay::state::State::new(lower, inos);
        for &(ino, kind) in &held {
            if kind == Kind::File {
                self.copy_up_whole(ino)?;
            }
        }
        let t = crate::overlay::now();
        let mut kept = self.remake(&left_out, &in_packet, t)?;
        // Made in the new view first: a record it refuses is never written,
        // so the journal replays at the next mount. (With the generations
        // handed out so far: a directory these records materialize must
        // keep the one the kernel knows.)
        let stale_times = {
            let st = self.state.read_recursive();
            fresh.carry_generations(&st);
            let new_lower = fresh.lower.clone();
            for r in &kept {
                fresh.apply(&new_lower, r)?;
            }
            let (modes, stale) = self.carry_shown(&st, &fresh, items, &new_numbers);
            for r in &modes {
                fresh.apply(&new_lower, r)?;
            }
            kept.extend(modes);
            stale
        };
        let carried_data: HashSet<u64> = kept
            .iter()
            .filter_map(|r| match r {
                Record::Mknode { data, .. } => *data,
                _ => None,
            })
            .collect();
        // One line: a crash that cuts it leaves the journal as it was
        // before the rebase (its torn tail is dropped), never a rebase
        // without the entries it keeps.
        let rec = Record::Rebase {
            t,
            packet: digest.to_string(),
            output: crate::packet::path::shown_path(output),
            inos: given,
            kept,
        };
        self.upper.append_durable(&rec)?;
        crate::barrier::wait(bar, crate::barrier::Point::RebaseRecorded);
        phase("recorded");
        let (old_inos, old_data, kept_data) = {
            let mut st = self.state.write();
            let old_lower = st.lower.clone();
            let mut carried: HashSet<Ino> = HashSet::new();
            for &(ino, _) in &held {
                // (A lower entry is materialized, taking the kernel's count.)
                let Ok(n) = st.node_mut(&old_lower, ino) else {
                    continue;
                };
                // A file's content the old packet holds goes with the old
                // packet: one held since `copy_up` above is only kept from
                // its number's next user, never served.
                if matches!(n.content, Content::Lower(_)) {
                    continue;
                }
                if n.kind == Kind::Symlink && n.target.is_none() {
                    n.target = Some(crate::overlay::target_of(&old_lower, n).into());
                }
                n.lower = None;
                n.nlink = 0;
                if n.kind == Kind::Dir {
                    n.children = Some(Default::default());
                    n.subdirs = 0;
                }
                carried.insert(ino);
            }
            let old_inos: Vec<Ino> = st.nodes.keys().copied().collect();
            let mut old_data: Vec<u64> = Vec::new();
            let mut kept_data: Vec<u64> = Vec::new();
            let refs = st.kernel_refs();
            for (ino, n) in &st.nodes {
                if let Content::Upper(id) = n.content {
                    if carried.contains(ino) || carried_data.contains(&id) {
                        kept_data.push(id);
                    } else {
                        old_data.push(id);
                    }
                }
            }
            for &ino in &carried {
                if let Some(n) = st.nodes.remove(&ino) {
                    fresh.nodes.insert(ino, n);
                }
            }
            fresh.next_data = st.next_data;
            fresh.applied += st.applied;
            *st = fresh;
            moved.serves_new = true;
            // The kernel's references carry over: paths keep their numbers
            // (the moved nodes brought their own).
            for (ino, count) in refs {
                if !carried.contains(&ino) {
                    st.add_ref(ino, count as i64);
                }
            }
            // One the kernel forgot since it was counted goes now.
            for &ino in &carried {
                if let Some(id) = st.drop_if_unused(ino) {
                    kept_data.retain(|&k| k != id);
                    old_data.push(id);
                }
            }
            (old_inos, old_data, kept_data)
        };
        // The record is durable, so what follows it is tidying: a failed
        // compaction (a full disk) leaves the journal as it is, which a
        // mount replays from its last rebase record. The old data files
        // are of no use either way, and the kernel's attributes of the old
        // nodes are out of date either way.
        let compacted = self.upper.compact(&rec, &digest);
        if compacted.is_ok() {
            crate::barrier::wait(bar, crate::barrier::Point::RebaseCompacted);
            phase("compacted");
        }
        for id in old_data {
            if !kept_data.contains(&id) {
                self.upper.remove_data(id);
            }
        }
        self.tell_kernel(old_inos, &stale_times, items);
        moved
            .renumbered
            .extend(renumbered_names(items, &renumbered));
        phase("invalidated");
        compacted?;
        tracing::info!(%digest, "rebased onto the sealed packet");
        Ok(())
    }

    /// The names of the merged view a packet of `items` leaves out
    /// (credentials, FIFOs and other special files, `--exclude`d entries,
    /// the other names of an excluded file), with everything under them,
    /// parents first: `(directory, name, number)`. A rebase keeps them on
    /// the mount, never in a packet; a left-out name of a file the packet
    /// holds under another name comes with that file's number, to be
    /// linked to it. Files whose content the old packet holds are copied
    /// up (and synced), so that they outlive it.
    fn left_out(
        &self,
        items: &[Item],
        in_packet: &HashSet<Ino>,
    ) -> Result<Vec<(Ino, String, Ino)>> {
        let mut out = Vec::new();
        {
            let st = self.state.read_recursive();
            let lower = &*st.lower;
            let mut stack: Vec<(Ino, String, Ino)> = Vec::new();
            // Another name of a file the packet holds (a hard link made on
            // the mount, `--exclude`d): kept as a link to it.
            let linked = |dir: &str, name: &str, ino: Ino| {
                matches!(st.get(lower, ino), Some(Ref::Node(n)) if n.kind == Kind::File && n.nlink > 1)
                    && {
                        let path = format!("{dir}/{name}");
                        items
                            .binary_search_by(|x| x.path.as_bytes().cmp(path.as_bytes()))
                            .is_err()
                    }
            };
            for it in items.iter().filter(|it| matches!(it.kind, ItemKind::Dir)) {
                for (name, ino) in st.list(lower, it.ino)? {
                    if in_packet.contains(&ino) {
                        if linked(&it.path, &name, ino) {
                            out.push((it.ino, name.to_string(), ino));
                        }
                        continue;
                    }
                    stack.push((it.ino, name.to_string(), ino));
                    while let Some((dir, name, ino)) = stack.pop() {
                        out.push((dir, name, ino));
                        if st.kind(lower, ino) == Some(Kind::Dir) {
                            for (n, i) in st.list(lower, ino)? {
                                if in_packet.contains(&i) {
                                    out.push((ino, n.to_string(), i));
                                } else {
                                    stack.push((ino, n.to_string(), i));
                                }
                            }
                        }
                    }
                }
            }
        }
        // Files copied up here outlive the old packet, which this seal may
        // have replaced: made durable before the record that refers to
        // them.
        for &(_, _, ino) in out.iter().filter(|(_, _, ino)| !in_packet.contains(ino)) {
            let lower_content = {
                let st = self.state.read_recursive();
                match st.get(&st.lower, ino) {
                    // (Copied up by chunk: the chunks still the packet's.)
                    Some(Ref::Node(n)) => {
                        matches!(n.content, Content::Lower(_)) || n.chunks.is_some()
                    }
                    Some(Ref::Lower(i)) => st.lower.kind(i) == Kind::File,
                    None => false,
                }
            };
            if lower_content {
                let id = self.copy_up_whole(ino)?;
                let f = self.upper.data(id)?;
                f.sync_all()
                    .map_err(Error::upper("fsync a file kept out of the packet"))?;
                self.upper.sync_data_name(id)?;
            }
        }
        Ok(out)
    }

    /// The records that make `left_out` again, at time `t`, over a lower
    /// layer that lacks them: a node each, with its number, generation,
    /// owner, mode and data file (a file's times are its data file's), a
    /// link for a file's next name (or a name of a file in the packet), and
    /// last the times of the other kinds.
    fn remake(
        &self,
        left_out: &[(Ino, String, Ino)],
        in_packet: &HashSet<Ino>,
        t: crate::overlay::journal::Nanos,
    ) -> Result<Vec<Record>> {
        let st = self.state.read_recursive();
        let lower = &*st.lower;
        let mut made: HashSet<Ino> = HashSet::new();
        let mut recs = Vec::new();
        // Last: making an entry sets its directory's times.
        let mut times = Vec::new();
        for (dir, name, ino) in left_out {
            if made.contains(ino) || in_packet.contains(ino) {
                recs.push(Record::Link {
                    t,
                    ino: *ino,
                    parent: *dir,
                    name: name.clone(),
                });
                continue;
            }
            let a = self.attr_of(&st, *ino)?;
            let (data, target) = match st.get(lower, *ino).ok_or(Error::NotFound)? {
                Ref::Node(n) => match n.content {
                    Content::Upper(id) => (Some(id), None),
                    // Copied up by `left_out`; not otherwise.
                    Content::Lower(_) => continue,
                    Content::None if n.kind == Kind::Symlink => {
                        (None, Some(crate::overlay::target_of(lower, n).to_string()))
                    }
                    Content::None => (None, None),
                },
                Ref::Lower(i) => match &lower.manifest().entries[i as usize].kind {
                    EntryKind::Symlink(target) => (None, Some(target.to_string())),
                    EntryKind::Dir => (None, None),
                    EntryKind::File(_) => continue,
                },
            };
            made.insert(*ino);
            recs.push(Record::Mknode {
                t,
                ino: *ino,
                generation: a.generation,
                parent: *dir,
                name: name.clone(),
                kind: a.kind,
                perm: a.perm,
                uid: a.uid,
                gid: a.gid,
                rdev: a.rdev,
                data,
                target,
            });
            if data.is_none() {
                times.push(Record::Setattr {
                    t,
                    ino: *ino,
                    perm: None,
                    uid: None,
                    gid: None,
                    atime: Some(a.atime),
                    mtime: Some(a.mtime),
                });
            }
        }
        recs.append(&mut times);
        Ok(recs)
    }
}

/// What the mount showed of the entries a packet holds that the packet
/// cannot give, kept on the mount across a rebase onto it: their
/// permission bits beyond the executable one, their owners, and any time
/// the new view would show earlier than the old one did. A file made
/// private on the mount (`chmod 600`) must not turn readable by others
/// when the mount moves onto the packet, nor a file change hands; and a
/// time the mount has shown never goes back (a directory renamed into
/// keeps the rename's time, which no file's mtime in the packet gives, so
/// a process caching its listing by mtime, as Python's importer does,
/// sees the listing change; a file sealed `--zero-mtimes` keeps its mtime
/// until a fresh mount; a file changed this turn keeps its ctime, which
/// its content stamp would put decades back). A time the new view shows
/// later stays later. Returns the records that set them in `fresh` (the
/// new view, with the left-out entries made again; the renumbered names
/// of `items` by index in `new_numbers`), and the numbers the kernel holds
/// of entries the old view served from its packet whose times move
/// forward, to tell the kernel.
impl Overlay {
    fn carry_shown(
        &self,
        old: &crate::overlay::state::State,
        fresh: &crate::overlay::state::State,
        items: &[Item],
        new_numbers: &HashMap<usize, Ino>,
    ) -> (Vec<Record>, Vec<Ino>) {
        use crate::overlay::state::Ref;
        let held: HashSet<Ino> = old.kernel_refs().into_iter().map(|(i, _)| i).collect();
        let mut records = Vec::new();
        let mut stale = Vec::new();
        for (k, it) in items.iter().enumerate() {
            // A renumbered name (another name of a hard-linked file) has
            // the number the new packet gave it.
            let ino = new_numbers.get(&k).copied().unwrap_or(it.ino);
            let (Ok(was), Ok(now)) = (self.attr_of(old, it.ino), self.attr_of(fresh, ino)) else {
                continue;
            };
            let perm = (was.perm != now.perm).then_some(was.perm);
            let uid = (was.uid != now.uid).then_some(was.uid);
            let gid = (was.gid != now.gid).then_some(was.gid);
            let mtime_back = now.mtime < was.mtime;
            if perm.is_some()
                || uid.is_some()
                || gid.is_some()
                || mtime_back
                || now.ctime < was.ctime
            {
                records.push(Record::Setattr {
                    // (A setattr's time becomes the ctime.)
                    t: was.ctime.max(now.ctime),
                    ino,
                    perm,
                    uid,
                    gid,
                    atime: mtime_back.then_some(was.atime),
                    mtime: mtime_back.then_some(was.mtime),
                });
            }
            // (The old view's nodes are all told of anyway.)
            let was_lower = matches!(old.get(&old.lower, it.ino), Some(Ref::Lower(_)));
            let forward = now.mtime > was.mtime || now.ctime > was.ctime;
            if was_lower && forward && held.contains(&it.ino) {
                stale.push(ino);
            }
        }
        (records, stale)
    }
}

/// The numbers the new view keeps that a fresh mount of the new packet
/// would not give: `(renumbered, given)`. One number is one file: the
/// names of a file hard-linked on the mount are separate files in the
/// packet, so one name keeps the number (the one whose own number it is,
/// else the first in path order); the others (`renumbered`, by index in
/// `items`) get numbers of their own, and the kernel is told to look them
/// up again. `given`: every other path whose number is not its own (a
/// file renamed on the mount), in path order.
fn plan_numbers(items: &[Item]) -> (HashSet<usize>, Vec<(String, Ino)>) {
    use rayon::prelude::*;
    let mut by_ino: Vec<(Ino, usize)> = items
        .iter()
        .enumerate()
        .map(|(k, it)| (it.ino, k))
        .collect();
    by_ino.sort_unstable();
    let mut renumbered: HashSet<usize> = HashSet::new();
    for run in by_ino.chunk_by(|a, b| a.0 == b.0).filter(|r| r.len() > 1) {
        let own =
            |&&(ino, k): &&(Ino, usize)| crate::overlay::ino::candidate(&items[k].path, 0) == ino;
        let keeper = run.iter().find(own).unwrap_or(&run[0]).1;
        renumbered.extend(run.iter().map(|&(_, k)| k).filter(|&k| k != keeper));
    }
    let mut given: Vec<(String, Ino)> = items
        .par_iter()
        .enumerate()
        .filter(|(k, it)| {
            it.ino != crate::overlay::ino::ROOT
                && crate::overlay::ino::candidate(&it.path, 0) != it.ino
                && !renumbered.contains(k)
        })
        .map(|(_, it)| (it.path.clone(), it.ino))
        .collect();
    given.sort();
    (renumbered, given)
}

impl Overlay {
    /// Tells the kernel what a rebase changed of what it caches: the
    /// attributes of every node of the old view (`old_inos`) and of the
    /// root, the times the new packet moves forward (`stale_times`: entries
    /// the old view served from its packet, such as a directory whose time
    /// is its packet's newest file's), and the targets of symlinks the seal
    /// rewrote (they now read as the packet stores them).
    fn tell_kernel(&self, old_inos: Vec<Ino>, stale_times: &[Ino], items: &[Item]) {
        let Some(f) = &*self.invalidate.lock() else {
            return;
        };
        for ino in old_inos {
            f(Stale::Attr(ino));
        }
        f(Stale::Attr(crate::overlay::ino::ROOT));
        for &ino in stale_times {
            f(Stale::Attr(ino));
        }
        for it in items {
            if let ItemKind::Symlink(_, true) = it.kind {
                f(Stale::Content(it.ino));
            }
        }
    }
}

/// The names of `items` a rebase gave other numbers (`renumbered`, by
/// index), as `(directory's number, name)`, for the kernel to drop once
/// changes may go on.
fn renumbered_names(items: &[Item], renumbered: &HashSet<usize>) -> Vec<(Ino, String)> {
    let mut names = Vec::new();
    for &k in renumbered {
        let Some((dir, name)) = items[k].path.rsplit_once('/') else {
            continue;
        };
        let at = items.binary_search_by(|it| it.path.as_bytes().cmp(dir.as_bytes()));
        if let Ok(d) = at {
            names.push((items[d].ino, name.to_owned()));
        }
    }
    names
}

impl Overlay {
    /// Hands what this turn changed (the content the seal took from the
    /// upper directory, still there) to the spool of the packet it
    /// uploaded, which checks it against the manifest and adds it to the
    /// cache: after the rebase, reading it costs no request, as reading
    /// what the parent had costs none (the cache has that).
    fn warm_uploaded(&self, packet: &crate::packet::reader::Packet, items: &[Item]) {
        let entries = &packet.manifest.entries;
        let mut buf = Vec::new();
        for it in items.iter().filter(|_| packet.backing().round_trips()) {
            let ItemKind::File(f) = &it.kind else {
                continue;
            };
            let Source::Upper(id) = f.from else { continue };
            let Ok(i) = entries.binary_search_by(|e| e.path.as_bytes().cmp(it.path.as_bytes()))
            else {
                continue;
            };
            let (Some(meta), Ok(file)) = (entries[i].file(), self.upper.data(id)) else {
                continue;
            };
            // A piece at a time: a chunk is a unit of the spool.
            let start = packet.content_offset(i);
            let mut at = 0;
            while at < meta.size {
                let n = crate::packet::format::CHUNK_SIZE.min(meta.size - at);
                let k = at / crate::packet::format::CHUNK_SIZE;
                // A chunk a file copied up by chunk still reads from the
                // old packet is not in its data file (a hole there): it
                // comes from the cache, or the store, as the parent's did.
                if f.reads_lower(k) {
                    at += n;
                    continue;
                }
                buf.resize(n as usize, 0);
                if std::os::unix::fs::FileExt::read_exact_at(&*file, &mut buf, at).is_err()
                    || packet.backing().offer(start + at, &buf) < n
                {
                    break;
                }
                at += n;
            }
        }
    }

    /// The packet a seal just uploaded, opened as a remote mount opens
    /// one ([`Packet::open_remote`], with the mount's own cache and fetch
    /// settings), but with no trace to prefetch: its trace is what this
    /// turn read, uploaded after the rebase, and what it names is in the
    /// cache (fetched this turn) or was just offered to the new spool
    /// (written this turn).
    ///
    /// [`Packet::open_remote`]: crate::packet::reader::Packet::open_remote
    fn open_uploaded(
        &self,
        remote: &super::RemoteSeal,
        limits: &Limits,
    ) -> Result<crate::packet::reader::Packet> {
        // Given with every rebase (`RemoteSeal::reading`).
        let mut reading = remote.reading.clone().ok_or_else(|| {
            Error::Packet(crate::packet::Error::io(
                "cannot read the uploaded packet",
                std::io::Error::other("no settings to read it with were given"),
            ))
        })?;
        if reading.spool.prefetch == crate::store::spool::Prefetch::Trace {
            reading.spool.prefetch = crate::store::spool::Prefetch::None;
        }
        crate::packet::reader::Packet::open_remote(&remote.location, limits, &reading)
            .map_err(Error::Packet)
    }
}
