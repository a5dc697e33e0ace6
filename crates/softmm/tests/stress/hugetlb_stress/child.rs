//! Children

use super::*;

#[derive(Clone, Copy, Debug)]
pub(super) enum CState {
    /// Nothing mapped here in the child.
    Empty,
    /// Inherited (or first faulted in) holding this tag; the owner may take
    /// an inherited page back (`unmap_ref_private`): `SIGBUS`.
    Seen(u64),
    /// Written by the child itself: its own page.
    Own(u64),
}

pub(super) struct CMap {
    pub(super) addr: u64,
    pub(super) kind: Kind,
    pub(super) file: u64,
    pub(super) pgoff: u64,
    pub(super) slots: Vec<Option<CState>>,
}

pub(super) struct Child {
    pub(super) mm: Arc<AddressSpace>,
    pub(super) maps: Vec<CMap>,
    pub(super) lane: usize,
    pub(super) writer: u64,
    pub(super) seq: u64,
    pub(super) sh: Arc<Shared>,
    pub(super) rng: Rng,
}

impl Child {
    pub(super) fn run(mut self) -> Vec<String> {
        let mut log = Vec::new();
        let mut cpu = Cpu::attached(&self.mm);
        let ops = 2 + self.rng.below(6);
        for _ in 0..ops {
            let all: Vec<(usize, usize)> = self
                .maps
                .iter()
                .enumerate()
                .flat_map(|(mi, m)| m.slots.iter().enumerate().filter_map(move |(i, s)| s.map(|_| (mi, i))))
                .collect();
            if all.is_empty() {
                break;
            }
            bump(&self.sh.c.child_ops);
            let (mi, i) = all[self.rng.below(all.len() as u64) as usize];
            let m = &self.maps[mi];
            let base = m.addr + i as u64 * HP;
            let what =
                format!("child: {:?} mapping at {base:#x} (file {} index {})", m.kind, m.file, m.pgoff + i as u64);
            let w = || what.clone();
            let st = m.slots[i].unwrap();
            let op = self.rng.below(10);
            log.push(format!("  child op {op} (0-3 read, 4-7 write, 8 dontneed, 9 munmap) {what} {st:?}"));
            match op {
                0..=3 => {
                    if !m.kind.private() {
                        let (key, idx) = (m.file, m.pgoff + i as u64);
                        let want = self.sh.lane(key, idx, self.lane);
                        let owed = self.sh.owed_now();
                        match rd(&mut cpu, base, self.lane as u64, &w) {
                            Ok(v) => {
                                assert_eq!(v, want, "{what}: the child's lane of a shared page");
                                self.sh.touch(key, idx, None);
                            }
                            Err(e) if is_bus(&e) && self.sh.owed_since(owed) => bump(&self.sh.c.child_bus),
                            Err(e) => panic!("{what}: {e}"),
                        }
                        continue;
                    }
                    match (rd(&mut cpu, base, PRIV_LANE, &w), st) {
                        (Ok(v), CState::Seen(t) | CState::Own(t)) => {
                            assert_eq!(v, t, "{what}: the child reads its page ({st:?})")
                        }
                        (Ok(v), CState::Empty) => {
                            assert_eq!(v, 0, "{what}: the child's new page");
                            self.maps[mi].slots[i] = Some(CState::Seen(0));
                        }
                        // No unreserved page for the child, or its parent took
                        // the page back.
                        (Err(e), CState::Seen(_) | CState::Empty) if is_bus(&e) => bump(&self.sh.c.child_bus),
                        (Err(e), _) => panic!("{what}: child's read ({st:?}): {e}"),
                    }
                }
                4..=7 => {
                    self.seq += 1;
                    let t = self.writer << 32 | self.seq;
                    if !m.kind.private() {
                        let (key, idx) = (m.file, m.pgoff + i as u64);
                        let owed = self.sh.owed_now();
                        match wr(&mut cpu, base, self.lane as u64, t) {
                            Ok(()) => self.sh.touch(key, idx, Some((self.lane, t))),
                            Err(e) if is_bus(&e) && self.sh.owed_since(owed) => bump(&self.sh.c.child_bus),
                            Err(e) => panic!("{what}: {e}"),
                        }
                        continue;
                    }
                    match (wr(&mut cpu, base, PRIV_LANE, t), st) {
                        (Ok(()), _) => self.maps[mi].slots[i] = Some(CState::Own(t)),
                        (Err(e), CState::Seen(_) | CState::Empty) if is_bus(&e) => bump(&self.sh.c.child_bus),
                        (Err(e), _) => panic!("{what}: child's write ({st:?}): {e}"),
                    }
                }
                8 => {
                    self.mm.madvise(base, HP, MADV_DONTNEED).unwrap_or_else(|e| panic!("{what}: {e}"));
                    if m.kind.private() {
                        self.maps[mi].slots[i] = Some(CState::Empty);
                    }
                }
                _ => {
                    self.mm.munmap(base, HP).unwrap_or_else(|e| panic!("{what}: {e}"));
                    self.maps[mi].slots[i] = None;
                }
            }
        }
        drop(cpu);
        log
    }
}
