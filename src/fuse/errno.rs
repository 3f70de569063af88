//! The one errno table. Exhaustive, no wildcard: a new overlay error does
//! not compile until someone picks its errno here.

use fuser::Errno;

use crate::overlay::Error;

/// The errno for an overlay error.
pub fn errno(e: &Error) -> Errno {
    match e {
        Error::NotFound => Errno::ENOENT,
        Error::Exists => Errno::EEXIST,
        Error::NotDir => Errno::ENOTDIR,
        Error::IsDir => Errno::EISDIR,
        Error::NotEmpty => Errno::ENOTEMPTY,
        Error::NameTooLong => Errno::ENAMETOOLONG,
        // "Illegal byte sequence": the name cannot be stored in a packet.
        Error::NotUtf8 => Errno::from_i32(libc::EILSEQ),
        Error::Invalid => Errno::EINVAL,
        // The packet root holds only the parts: not a permission problem
        // a chmod could fix, so EPERM rather than EACCES.
        Error::NotPermitted => Errno::EPERM,
        Error::NotSupported => Errno::from_i32(libc::EOPNOTSUPP),
        Error::NoData => Errno::from_i32(libc::ENODATA),
        Error::TooManyLinks => Errno::from_i32(libc::EMLINK),
        Error::TooBig => Errno::from_i32(libc::EFBIG),
        // A secret is a read-only file shown from the host, like a
        // read-only bind mount of it: EROFS for a change (not EACCES,
        // which a chmod could lift), EBUSY for its name, EXDEV for a link.
        Error::ReadOnly => Errno::from_i32(libc::EROFS),
        // The mount is ending: its changes are over, as a file system
        // remounted read-only.
        Error::Ending => Errno::from_i32(libc::EROFS),
        Error::Busy => Errno::from_i32(libc::EBUSY),
        Error::CrossDevice => Errno::from_i32(libc::EXDEV),
        // Never return unverified bytes: the read fails as a device error.
        Error::Corrupt { .. } | Error::PacketChanged { .. } => Errno::EIO,
        // The OS error of the upper filesystem, passed through (ENOSPC,
        // EDQUOT, ...); EIO only when the error carries no errno.
        Error::Upper { source, .. }
        | Error::PacketIo { source, .. }
        | Error::Secret { source, .. } => source.raw_os_error().map_or(Errno::EIO, Errno::from_i32),
        // Mount-time and seal errors; they never reach a FUSE reply, EIO if
        // they did.
        Error::UpperRefused { .. }
        | Error::UpperMismatch { .. }
        | Error::Replay { .. }
        | Error::Packet(_)
        | Error::Rebase { .. }
        | Error::Refused { .. } => Errno::EIO,
    }
}
