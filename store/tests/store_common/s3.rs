//! A real S3 server for tests: versitygw (posix backend) in a child process,
//! killed on drop. The binary is `$VERSITYGW`, else `versitygw` on PATH; when
//! it is missing the test fails (it is a dependency of these tests, not an
//! optional extra).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use object_store::signer::Signer;

pub const ACCESS: &str = "torpor-test-access";
pub const SECRET: &str = "torpor-test-secret-key";
pub const REGION: &str = "us-east-1";

pub struct VersityGw {
    pub bin: PathBuf,
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub bucket: String,
    child: Option<Child>,
}

fn find_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("VERSITYGW") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "VERSITYGW={} is not a file: the S3 store tests need the versitygw binary (test/rig deps)", p.display());
        return p;
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            let p = d.join("versitygw");
            if p.is_file() {
                return p;
            }
        }
    }
    panic!("versitygw not found (set VERSITYGW=/path/to/versitygw or put it on PATH): the S3 store tests run against a real S3 server");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl VersityGw {
    /// Start a server with an empty bucket.
    pub async fn start(bucket: &str) -> VersityGw {
        let mut gw =
            VersityGw { bin: find_binary(), port: free_port(), dir: tempfile::tempdir().unwrap(), bucket: bucket.to_string(), child: None };
        gw.up();
        gw.create_bucket().await;
        gw
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Start (or restart) the server process on the same port and directory.
    pub fn up(&mut self) {
        assert!(self.child.is_none(), "versitygw already running");
        let log = std::fs::File::create(self.dir.path().join("versitygw.log")).unwrap();
        let data = self.dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let child = Command::new(&self.bin)
            .args(["--access", ACCESS, "--secret", SECRET, "--region", REGION, "--port", &format!("127.0.0.1:{}", self.port), "posix"])
            .arg(&data)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.bin.display()));
        self.child = Some(child);
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("versitygw exited with {status}: {}", self.log());
            }
            assert!(start.elapsed() < Duration::from_secs(60), "versitygw did not listen on {}: {}", self.port, self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kill the server process (SIGKILL) and reap it.
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("versitygw.log")).unwrap_or_default()
    }

    pub fn builder(&self) -> object_store::aws::AmazonS3Builder {
        object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_endpoint(self.endpoint())
            .with_allow_http(true)
            .with_access_key_id(ACCESS)
            .with_secret_access_key(SECRET)
            .with_region(REGION)
    }

    /// The store's `remote_url`/`remote_options` for this server.
    pub fn remote(&self, prefix: &str) -> (String, Vec<(String, String)>) {
        (
            format!("s3://{}/{prefix}", self.bucket),
            vec![
                ("endpoint".into(), self.endpoint()),
                ("allow_http".into(), "true".into()),
                ("access_key_id".into(), ACCESS.into()),
                ("secret_access_key".into(), SECRET.into()),
                ("region".into(), REGION.into()),
            ],
        )
    }

    /// CreateBucket through the S3 API: a presigned `PUT /<bucket>/`.
    async fn create_bucket(&self) {
        let s3 = self.builder().build().unwrap();
        let url = s3.signed_url(http::Method::PUT, &object_store::path::Path::from(""), Duration::from_secs(300)).await.unwrap();
        let target = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        };
        let mut conn = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(conn, "PUT {target} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", self.port).unwrap();
        let mut resp = String::new();
        conn.read_to_string(&mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 200"), "CreateBucket {}: {resp}", self.bucket);
    }
}

impl Drop for VersityGw {
    fn drop(&mut self) {
        self.down();
    }
}
