//! Network namespaces for real network faults between real processes (needs root and
//! `iproute2`): one namespace per member, each with a veth whose other end is on a
//! bridge in the test's own namespace, so the test reaches every member as a client
//! would. Faults are what the kernel can do without netem or iptables: a blackhole
//! route (packets from one member to another dropped at the sender, in one direction
//! only) and a link set down (every packet dropped, no FIN, no RST: a half-open
//! connection for whoever was talking to it). All of it is removed on drop.

use std::net::Ipv4Addr;
use std::process::Command;

/// The namespaces, veths and bridge of one test.
pub(crate) struct Netns {
    tag: String,
    subnet: u8,
    names: Vec<String>,
    bridge: String,
}

/// Runs `ip ARGS`; panics with its output if it fails.
fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        output.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Netns {
    /// Namespaces for `members` members on 10.99.S.0/24 (S from the process id), the
    /// test's side of the bridge at .254.
    pub(crate) fn create(members: u8) -> Self {
        // Unique per process and per call: a namespace being torn down may linger.
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{:03}{}", pid % 1_000, made % 10);
        let subnet = ((pid + made) % 200) as u8 + 20;
        let netns = Self {
            names: (0..members).map(|i| format!("braid-{tag}-{i}")).collect(),
            bridge: format!("bb{tag}"),
            tag,
            subnet,
        };
        // Left over from a killed run with the same tag.
        netns.remove();
        let gateway = format!("10.99.{subnet}.254/24");
        ip(&["link", "add", &netns.bridge, "type", "bridge"]);
        ip(&["addr", "add", &gateway, "dev", &netns.bridge]);
        ip(&["link", "set", &netns.bridge, "up"]);
        for id in 0..members {
            let (host, inner) = netns.veth(id);
            let name = netns.name(id);
            let addr = format!("{}/24", netns.addr(id));
            ip(&["netns", "add", name]);
            ip(&["link", "add", &host, "type", "veth", "peer", "name", &inner]);
            ip(&["link", "set", &inner, "netns", name]);
            ip(&["link", "set", &host, "master", &netns.bridge]);
            ip(&["link", "set", &host, "up"]);
            ip(&["-n", name, "addr", "add", &addr, "dev", &inner]);
            ip(&["-n", name, "link", "set", &inner, "up"]);
            ip(&["-n", name, "link", "set", "lo", "up"]);
        }
        netns
    }

    /// Member `id`'s namespace.
    pub(crate) fn name(&self, id: u8) -> &str {
        &self.names[usize::from(id)]
    }

    /// Member `id`'s address.
    pub(crate) fn addr(&self, id: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 99, self.subnet, id + 1)
    }

    /// Member `id`'s veth: the end on the bridge, the end in its namespace.
    fn veth(&self, id: u8) -> (String, String) {
        (format!("vh{}{id}", self.tag), format!("vn{}{id}", self.tag))
    }

    /// Drops every packet `from` sends to `to` (one direction).
    pub(crate) fn cut(&self, from: u8, to: u8) {
        let dest = format!("{}/32", self.addr(to));
        ip(&["-n", self.name(from), "route", "add", "blackhole", &dest]);
    }

    /// Undoes [`Netns::cut`].
    pub(crate) fn heal(&self, from: u8, to: u8) {
        let dest = format!("{}/32", self.addr(to));
        ip(&["-n", self.name(from), "route", "del", "blackhole", &dest]);
    }

    /// Cuts member `id` off from every other member, both ways (the test still reaches
    /// it, as its clients do).
    pub(crate) fn isolate_from_peers(&self, id: u8) {
        for peer in self.peers(id) {
            self.cut(id, peer);
            self.cut(peer, id);
        }
    }

    /// Undoes [`Netns::isolate_from_peers`].
    pub(crate) fn rejoin_peers(&self, id: u8) {
        for peer in self.peers(id) {
            self.heal(id, peer);
            self.heal(peer, id);
        }
    }

    fn peers(&self, id: u8) -> impl Iterator<Item = u8> {
        (0..self.names.len() as u8).filter(move |p| *p != id)
    }

    /// Member `id`'s link down: every packet to or from it dropped, nothing sent to
    /// say so (connections to it are left half-open).
    pub(crate) fn link_down(&self, id: u8) {
        ip(&["-n", self.name(id), "link", "set", &self.veth(id).1, "down"]);
    }

    /// Member `id`'s link up again.
    pub(crate) fn link_up(&self, id: u8) {
        ip(&["-n", self.name(id), "link", "set", &self.veth(id).1, "up"]);
    }

    /// Deletes the namespaces (their veths go with them) and the bridge, ignoring what
    /// is not there.
    fn remove(&self) {
        for id in 0..self.names.len() as u8 {
            // Deleting one end deletes the pair at once, not when the namespace goes.
            let _ = Command::new("ip")
                .args(["link", "del", &self.veth(id).0])
                .output();
        }
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.remove();
    }
}
