//! `mount-s3 BUCKET DIR [--endpoint-url URL] [--force-path-style]
//! [--region R] [--read-only]`: mounts BUCKET at DIR the way mount-s3
//! 1.24 does (its `run.rs`: the same memory pool, client, superblock and
//! file-system configuration, with the defaults of its options), returns
//! once the mount is up and leaves the file system served by a child in
//! the background, as mount-s3 does without `--foreground`. Unmount with
//! `fusermount3 -u DIR`.
//!
//! What differs from mount-s3: only the options above; no EC2 instance
//! lookup (the throughput target is mount-s3's default when the lookup
//! fails, 10 Gbit/s). Logs go to syslog as mount-s3's do (without
//! `--log-directory`), warnings only, or what the filter in
//! `MOUNT_S3_LOG` (`debug`, ...) lets through.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use mountpoint_s3_client::config::{AddressingStyle, S3ClientAuthConfig};
use mountpoint_s3_client::user_agent::UserAgent;
use mountpoint_s3_fs::data_cache::DataCacheConfig;
use mountpoint_s3_fs::fs::{CacheConfig, TimeToLive};
use mountpoint_s3_fs::fuse::config::{FuseOptions, FuseSessionConfig, MountPoint};
use mountpoint_s3_fs::logging::{LoggingConfig, init_logging};
use mountpoint_s3_fs::memory::{
    CandidateSize, MINIMUM_MEM_LIMIT, PagedPool, effective_total_memory,
};
use mountpoint_s3_fs::s3::config::{
    ClientConfig, MemoryLimitSetting, PartConfig, Region, TargetThroughputSetting,
};
use mountpoint_s3_fs::s3::{Bucket, Prefix, S3Path, S3Personality};
use mountpoint_s3_fs::{
    MountpointConfig, Runtime, S3FilesystemConfig, Superblock, SuperblockConfig,
};

/// mount-s3's defaults: `--part-size`, `--max-threads`, its 1 MiB cache
/// block (a candidate size of the pool), and the time the parent waits
/// for the child's mount.
const PART_SIZE: usize = 8 << 20;
const MAX_THREADS: usize = 16;
const CACHE_BLOCK: usize = 1 << 20;
const MOUNT_TIMEOUT: Duration = Duration::from_secs(30);
/// Set in the child, which mounts and serves.
const CHILD: &str = "MOUNT_S3_BENCH_CHILD";

struct Args {
    bucket: String,
    dir: String,
    endpoint: Option<String>,
    path_style: bool,
    region: String,
    read_only: bool,
}

fn parse() -> anyhow::Result<Args> {
    let mut it = std::env::args().skip(1);
    let (mut pos, mut endpoint, mut path_style, mut read_only) = (Vec::new(), None, false, false);
    let mut region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
    while let Some(a) = it.next() {
        match a.as_str() {
            "--endpoint-url" => endpoint = Some(it.next().context("--endpoint-url needs a URL")?),
            "--region" => region = it.next().context("--region needs a name")?,
            "--force-path-style" => path_style = true,
            "--read-only" => read_only = true,
            _ if a.starts_with("--") => bail!("unknown option {a}"),
            _ => pos.push(a),
        }
    }
    let [bucket, dir] = <[String; 2]>::try_from(pos)
        .map_err(|_| anyhow!("usage: mount-s3 BUCKET DIR [OPTIONS]"))?;
    Ok(Args {
        bucket,
        dir,
        endpoint,
        path_style,
        region,
        read_only,
    })
}

fn main() -> anyhow::Result<()> {
    let args = parse()?;
    if std::env::var_os(CHILD).is_some() {
        return serve(&args);
    }
    // The parent: start the child, wait for its word that the mount is up.
    let mut child = Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the mount process")?;
    let out = child.stdout.take().context("no pipe")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    match rx.recv_timeout(MOUNT_TIMEOUT) {
        Ok(line) if line.starts_with("mounted") => {
            println!("bucket {} is mounted at {}", args.bucket, args.dir);
            Ok(())
        }
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            bail!("mounting {} at {} failed", args.bucket, args.dir)
        }
    }
}

/// The child: mount as mount-s3's `run::mount` does, say so, serve.
fn serve(args: &Args) -> anyhow::Result<()> {
    let _logging = init_logging(LoggingConfig {
        log_file: None,
        log_to_stdout: false,
        default_filter: std::env::var("MOUNT_S3_LOG").unwrap_or_else(|_| "warn,awscrt=off".into()),
    })?;
    let memory_limit = MemoryLimitSetting::Default(
        ((effective_total_memory() as f64 * 0.95) as usize).max(MINIMUM_MEM_LIMIT),
    );
    let client_config = ClientConfig {
        region: Region::new_user_specified(args.region.clone()),
        endpoint_url: args.endpoint.clone(),
        addressing_style: if args.path_style {
            AddressingStyle::Path
        } else {
            AddressingStyle::Automatic
        },
        dual_stack: false,
        transfer_acceleration: false,
        auth_config: S3ClientAuthConfig::Default,
        requester_pays: false,
        expected_bucket_owner: None,
        throughput_target: TargetThroughputSetting::Default,
        bind: None,
        part_config: PartConfig::with_part_size(PART_SIZE).validate(memory_limit)?,
        user_agent: UserAgent::new(Some("mountpoint-s3/1.24.0-bench".into())),
        tls_config: None,
    };
    let pool = PagedPool::config()
        .with_candidate_sizes([
            CandidateSize::prunable(CACHE_BLOCK),
            CandidateSize::prunable(client_config.part_config.read_size_bytes),
            CandidateSize::new(client_config.part_config.write_size_bytes),
        ])
        .with_memory_limit(memory_limit.bytes())
        .with_maintenance_interval(Duration::from_secs(60))
        .build();
    let s3_path = S3Path::new(Bucket::new(args.bucket.clone())?, Prefix::default());
    let client = client_config
        .create_client(pool.clone(), Some(&s3_path))
        .context("creating the S3 client")?;
    let runtime = Runtime::new(client.event_loop_group());
    let personality = S3Personality::infer_from_bucket(&s3_path.bucket, &client.endpoint_config());
    let fs_config = S3FilesystemConfig {
        // No data cache: metadata lives as short as mount-s3 keeps it then.
        cache_config: CacheConfig::new(TimeToLive::Minimal),
        read_only: args.read_only,
        s3_personality: personality,
        ..Default::default()
    };
    let superblock = Superblock::new(
        client.clone(),
        s3_path,
        SuperblockConfig {
            cache_config: fs_config.cache_config.clone(),
            s3_personality: personality,
        },
    );
    let fuse = FuseSessionConfig::new(
        MountPoint::new(&args.dir).context("the mount point")?,
        FuseOptions {
            read_only: args.read_only,
            auto_unmount: false,
            allow_root: false,
            allow_other: false,
            clone_fd: false,
        },
        MAX_THREADS,
    )?;
    let session = MountpointConfig::new(fuse, fs_config, DataCacheConfig::default())?
        .create_fuse_session(superblock, client, runtime, pool)?;
    let mut out = std::io::stdout();
    writeln!(out, "mounted")?;
    out.flush()?;
    session.join().context("serving the mount")
}
