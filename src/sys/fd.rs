//! Descriptors this process did not open itself: one handed to it when it
//! started (`sessionfs mount PACKET /dev/fd/N`, libfuse's convention for a
//! connection a privileged mounter opened and mounted), and one received
//! over a Unix socket (`SCM_RIGHTS`, from the mounter). Taking ownership of
//! a descriptor by its number is the crate's only `unsafe` code; each use
//! says why it is sound.
#![allow(unsafe_code)]

use std::collections::HashSet;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use parking_lot::Mutex;

/// Numbers already taken by [`inherited`]: each can be owned once.
static CLAIMED: Mutex<Option<HashSet<RawFd>>> = Mutex::new(None);

/// Takes ownership of descriptor `n`, which this process inherited open
/// from whoever started it. Refuses the standard streams, a number that
/// is not open, and a number taken before.
pub fn inherited(n: RawFd) -> io::Result<OwnedFd> {
    if n <= 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {n} is a standard stream, not a FUSE connection"),
        ));
    }
    let mut claimed = CLAIMED.lock();
    let claimed = claimed.get_or_insert_with(HashSet::new);
    if claimed.contains(&n) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {n} was taken already"),
        ));
    }
    // SAFETY: F_GETFD reads the flags of a descriptor number and touches
    // nothing; on a number that is not open it fails with EBADF.
    if unsafe { libc::fcntl(n, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    claimed.insert(n);
    // SAFETY: `n` is open (checked above), was inherited (this process
    // opened no descriptor under that number: the caller names one given
    // at start, before it opens any), and is owned only here: `CLAIMED`
    // refuses a second claim of the same number.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// Sends `bytes` and descriptor `fd` over `sock` (`SCM_RIGHTS`).
pub fn send_with_fd(sock: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [IoSlice::new(bytes)];
    let sent = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)?;
    if sent != bytes.len() {
        return Err(io::Error::other("short send with a descriptor"));
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes from `sock`, and the descriptor that
/// came with them, if one did; the byte count.
pub fn recv_with_fd(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        sock.as_fd().as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let n = msg.bytes;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(got) = c {
            fds.extend(got);
        }
    }
    // SAFETY: the kernel installed each of these numbers in this process's
    // table for this message just now; nothing else knows them, so each is
    // owned once, here (every one is wrapped, so none leaks).
    let mut owned: Vec<OwnedFd> = fds
        .into_iter()
        .map(|f| unsafe { OwnedFd::from_raw_fd(f) })
        .collect();
    if owned.len() > 1 {
        return Err(io::Error::other("more than one descriptor in one message"));
    }
    Ok((n, owned.pop()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_descriptor_crosses_a_socket_and_still_reads_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(b"hello")
            .unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        send_with_fd(&a, b"x", file.as_fd()).unwrap();
        let mut buf = [0u8; 8];
        let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"x");
        let got = std::fs::read_to_string(format!(
            "/proc/self/fd/{}",
            fd.as_ref().unwrap().as_raw_fd()
        ))
        .unwrap();
        assert_eq!(got, "hello");
        // Bytes alone bring none.
        (&a).write_all(b"y").unwrap();
        let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!((n, fd.is_none()), (1, true));
    }

    #[test]
    fn an_inherited_number_is_refused_when_standard_closed_or_taken() {
        assert!(inherited(1).is_err());
        assert!(inherited(987_654).is_err(), "not open");
    }
}
