//! When a connection that does nothing useful is closed.

use std::time::Duration;

/// When a connection that does nothing useful is closed: its first complete frame must
/// come within `connection_first_frame_ms` of the connect, a frame once begun must be
/// whole within `connection_frame_ms` (a client sending a byte every 100 ms holds
/// nothing for long), and with nothing in flight a connection may go
/// `connection_idle_ms` without a frame. On a node that requires authentication, a
/// connection must also have logged in within `connection_login_ms`: one that only
/// pings would otherwise hold a connection slot for the idle time.
pub(super) struct Deadlines {
    /// When a connection not yet logged in is closed (`None`: logged in, or no
    /// authentication).
    login_by: Option<tokio::time::Instant>,
    first_frame: Duration,
    frame: Duration,
    idle: Duration,
    connected: tokio::time::Instant,
    /// When the last complete frame arrived (none yet: `None`).
    last_frame: Option<tokio::time::Instant>,
    /// When bytes of the frame now buffered began to arrive.
    frame_started: Option<tokio::time::Instant>,
    /// When the connection was last seen with answers in flight.
    last_busy: Option<tokio::time::Instant>,
}

/// The next deadline, and why the connection closes there (`None`: only look again).
pub(super) struct Deadline {
    pub(super) at: tokio::time::Instant,
    pub(super) reason: Option<&'static str>,
}

impl Deadlines {
    pub(super) fn new(config: &crate::config::NodeConfig) -> Self {
        let ms = |v: u64| Duration::from_millis(v.max(1));
        let connected = tokio::time::Instant::now();
        Self {
            login_by: config
                .authentication
                .then(|| connected + ms(config.connection_login_ms)),
            first_frame: ms(config.connection_first_frame_ms),
            frame: ms(config.connection_frame_ms),
            idle: ms(config.connection_idle_ms),
            connected,
            last_frame: None,
            frame_started: None,
            last_busy: None,
        }
    }

    /// The connection logged in: the login deadline no longer applies.
    pub(super) fn logged_in(&mut self) {
        self.login_by = None;
    }

    /// The next deadline: the sooner of the frame deadlines and the login deadline.
    pub(super) fn next(&mut self, partial_frame: bool, busy: bool) -> Deadline {
        let deadline = self.next_frame_deadline(partial_frame, busy);
        match self.login_by {
            Some(at) if at <= deadline.at => Deadline {
                at,
                reason: Some("not logged in in time"),
            },
            _ => deadline,
        }
    }

    pub(super) fn frame_done(&mut self) {
        self.last_frame = Some(tokio::time::Instant::now());
        self.frame_started = None;
    }

    fn next_frame_deadline(&mut self, partial_frame: bool, busy: bool) -> Deadline {
        let now = tokio::time::Instant::now();
        if partial_frame {
            let started = *self.frame_started.get_or_insert(now);
            return Deadline {
                at: started + self.frame,
                reason: Some("a frame not completed in time"),
            };
        }
        self.frame_started = None;
        match self.last_frame {
            None => Deadline {
                at: self.connected + self.first_frame,
                reason: Some("no first frame in time"),
            },
            // Answers are still being worked on: not idle; look again soon.
            Some(_) if busy => {
                self.last_busy = Some(now);
                Deadline {
                    at: now + self.idle.min(Duration::from_secs(1)),
                    reason: None,
                }
            }
            Some(last) => Deadline {
                at: self.last_busy.map_or(last, |busy| busy.max(last)) + self.idle,
                reason: Some("idle"),
            },
        }
    }
}
