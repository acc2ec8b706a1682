//! Where the k links to each peer live.
//!
//! Shard `s` belongs to range `s * k / shards`, and range `j` sends over link `j`. Link
//! `j` to a peer is owned by one usable shard of range `j`, chosen by the peer's slot.
//! Both ends derive placement from their own configuration alone; nodes with different
//! shard counts still link (the receiving node routes frames with its own count), but
//! both must use the same k. Frames of the metadata group take link 0.
//!
//! Sizing rule: a range needs at least as many shards as there are peers for each link
//! to get a shard of its own, and range 0 one more when shard 0 is skipped (shard 0
//! hosts the listener, the dialer and the metadata group).

/// Most inbound handshakes a node runs at once; a full redial of every link to every
/// peer must fit.
pub const INBOUND_HANDSHAKES_MAX: usize = 64;

/// The link that carries metadata-group frames.
pub const METADATA_LINK: u16 = 0;

/// A link layout that cannot run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// k = 0.
    #[error("links per peer must be at least 1")]
    NoLinks,
    /// More links than shards.
    #[error("links per peer = {links} exceeds the shard count {shards}")]
    MoreLinksThanShards {
        /// k.
        links: u16,
        /// The shard count.
        shards: u16,
    },
    /// More links in total than the inbound handshake cap.
    #[error("links per peer = {links} with {peers} peers opens more than {cap} links, the inbound handshake cap")]
    TooManyLinks {
        /// k.
        links: u16,
        /// Peers.
        peers: usize,
        /// The cap.
        cap: usize,
    },
}

/// Shard count, links per peer and the shard-0 skip flag of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkLayout {
    shards: u16,
    links: u16,
    skip_shard_zero: bool,
}

impl LinkLayout {
    /// A layout for `shards` shards, `links` links per peer and `peers` peers.
    ///
    /// # Errors
    /// [`LayoutError`] for k = 0, k above the shard count, or more links in total than
    /// [`INBOUND_HANDSHAKES_MAX`].
    pub fn new(
        shards: u16,
        links: u16,
        skip_shard_zero: bool,
        peers: usize,
    ) -> Result<Self, LayoutError> {
        if links == 0 {
            return Err(LayoutError::NoLinks);
        }
        if links > shards {
            return Err(LayoutError::MoreLinksThanShards { links, shards });
        }
        if usize::from(links) * peers > INBOUND_HANDSHAKES_MAX {
            return Err(LayoutError::TooManyLinks {
                links,
                peers,
                cap: INBOUND_HANDSHAKES_MAX,
            });
        }
        Ok(Self {
            shards,
            links,
            skip_shard_zero,
        })
    }

    /// Shards of this node.
    pub fn shards(&self) -> u16 {
        self.shards
    }

    /// Links per peer (k).
    pub fn links(&self) -> u16 {
        self.links
    }

    /// The link `shard` sends over: its range.
    pub fn range_of(&self, shard: u16) -> u16 {
        let range =
            u32::from(shard.min(self.shards - 1)) * u32::from(self.links) / u32::from(self.shards);
        (range as u16).min(self.links - 1)
    }

    /// The first shard of range `link` (the shard count for `link == k`).
    fn first_of_range(&self, link: u16) -> u16 {
        // The smallest s with s * k / shards >= link, i.e. ceil(link * shards / k).
        let numerator = u32::from(link) * u32::from(self.shards);
        numerator.div_ceil(u32::from(self.links)) as u16
    }

    /// The shards of range `link`.
    pub fn range_shards(&self, link: u16) -> std::ops::Range<u16> {
        self.first_of_range(link)..self.first_of_range(link + 1)
    }

    /// The links whose range has fewer usable shards than `peers`, so that links to
    /// different peers share an owner shard (the sizing rule is broken there; it still
    /// works, with less parallelism). Empty when the rule holds.
    pub fn undersized_links(&self, peers: usize) -> Vec<u16> {
        (0..self.links)
            .filter(|link| {
                let range = self.range_shards(*link);
                let skipped = range.start == 0 && self.skip_shard_zero && range.end > 1;
                let usable = usize::from(range.end - range.start) - usize::from(skipped);
                usable < peers
            })
            .collect()
    }

    /// The shard that owns `link` to the peer in `peer_slot` (0-based among peers).
    ///
    /// # Panics
    /// If `link` is not below k: a caller bug.
    pub fn link_owner(&self, link: u16, peer_slot: u8) -> u16 {
        assert!(link < self.links, "link {link} of {}", self.links);
        let range = self.range_shards(link);
        let first_usable = if range.start == 0 && self.skip_shard_zero && range.end > 1 {
            1
        } else {
            range.start
        };
        let usable = range.end - first_usable;
        first_usable + u16::from(peer_slot) % usable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sizing_rule_is_checked() {
        // 4 shards, k = 2, shard 0 skipped: range 0 has 1 usable shard, range 1 has 2.
        let layout = LinkLayout::new(4, 2, true, 2).unwrap();
        assert_eq!(layout.undersized_links(2), vec![0]);
        assert_eq!(layout.undersized_links(1), Vec::<u16>::new());
        // 8 shards, k = 2: 3 and 4 usable shards for two peers.
        assert!(LinkLayout::new(8, 2, true, 2)
            .unwrap()
            .undersized_links(2)
            .is_empty());
    }

    #[test]
    fn refuses_layouts_that_cannot_run() {
        assert_eq!(LinkLayout::new(4, 0, true, 2), Err(LayoutError::NoLinks));
        assert_eq!(
            LinkLayout::new(4, 5, true, 2),
            Err(LayoutError::MoreLinksThanShards {
                links: 5,
                shards: 4
            })
        );
        assert!(matches!(
            LinkLayout::new(64, 40, true, 2),
            Err(LayoutError::TooManyLinks {
                links: 40,
                peers: 2,
                ..
            })
        ));
        let message = LayoutError::MoreLinksThanShards {
            links: 5,
            shards: 4,
        }
        .to_string();
        assert!(message.contains('5') && message.contains('4'), "{message}");
    }

    #[test]
    fn ranges_tile_the_shards_and_owners_sit_in_their_range() {
        for shards in 1..=16u16 {
            for links in 1..=shards {
                let layout = LinkLayout::new(shards, links, true, 2).unwrap();
                let mut next = 0;
                for link in 0..links {
                    let range = layout.range_shards(link);
                    assert_eq!(range.start, next, "{shards} shards, {links} links");
                    assert!(!range.is_empty());
                    for shard in range.clone() {
                        assert_eq!(layout.range_of(shard), link);
                    }
                    next = range.end;
                    for peer in 0..4u8 {
                        assert!(range.contains(&layout.link_owner(link, peer)));
                    }
                }
                assert_eq!(next, shards);
            }
        }
    }

    #[test]
    fn shard_zero_owns_no_link_while_its_range_has_another_shard() {
        let layout = LinkLayout::new(4, 2, true, 2).unwrap();
        assert_eq!(layout.range_shards(0), 0..2);
        assert_eq!(layout.link_owner(0, 0), 1);
        assert_eq!(
            layout.link_owner(0, 1),
            1,
            "4 links on 3 usable shards: one owns two"
        );
        assert_eq!(layout.link_owner(1, 0), 2);
        assert_eq!(layout.link_owner(1, 1), 3);
        // With one shard in range 0, shard 0 must own link 0.
        let single = LinkLayout::new(1, 1, true, 2).unwrap();
        assert_eq!(single.link_owner(0, 1), 0);
        // k = 1: every shard sends over link 0.
        let one = LinkLayout::new(4, 1, true, 2).unwrap();
        assert!((0..4).all(|s| one.range_of(s) == METADATA_LINK));
    }
}
