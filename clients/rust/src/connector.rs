//! Opening connections: one trait over standalone and cluster clients.

use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionLike, RedisResult};

/// A connection as the helpers use it.
pub type BoxedConnection = Box<dyn ConnectionLike + Send>;

/// Something that opens connections to the server (or cluster) that holds the locks.
///
/// Implemented for [`redis::Client`] and [`redis::cluster::ClusterClient`]; wrap your own to
/// add authentication hooks, metrics or fault injection.
pub trait Connector: Send + Sync + 'static {
    /// Opens a new connection. `timeout` bounds connecting and writing; `read_timeout` bounds
    /// each wait for a reply (`None`: no limit, used only for `WAIT 0`).
    fn connect(
        &self,
        timeout: Duration,
        read_timeout: Option<Duration>,
    ) -> RedisResult<BoxedConnection>;
}

impl Connector for redis::Client {
    fn connect(
        &self,
        timeout: Duration,
        read_timeout: Option<Duration>,
    ) -> RedisResult<BoxedConnection> {
        let conn = self.get_connection_with_timeout(nonzero(timeout))?;
        conn.set_write_timeout(Some(nonzero(timeout)))?;
        conn.set_read_timeout(read_timeout.map(nonzero))?;
        Ok(Box::new(conn))
    }
}

impl Connector for redis::cluster::ClusterClient {
    /// The cluster client's own settings (connection timeout, internal retries on `MOVED`,
    /// `ASK`, `TRYAGAIN`, ...) apply as well; its internal retries multiply the read timeout.
    fn connect(
        &self,
        timeout: Duration,
        read_timeout: Option<Duration>,
    ) -> RedisResult<BoxedConnection> {
        let conn = self.get_connection()?;
        conn.set_write_timeout(Some(nonzero(timeout)))?;
        conn.set_read_timeout(read_timeout.map(nonzero))?;
        Ok(Box::new(conn))
    }
}

impl<C: Connector + ?Sized> Connector for Arc<C> {
    fn connect(
        &self,
        timeout: Duration,
        read_timeout: Option<Duration>,
    ) -> RedisResult<BoxedConnection> {
        (**self).connect(timeout, read_timeout)
    }
}

/// Socket timeouts must not be zero (zero means "none" to some platforms).
fn nonzero(d: Duration) -> Duration {
    d.max(Duration::from_millis(1))
}
