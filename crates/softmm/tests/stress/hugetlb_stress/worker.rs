//! The worker of a long-lived process

use super::*;

pub(super) struct Worker {
    pub(super) p: Proc,
    pub(super) cpu: Cpu,
    pub(super) rng: Rng,
    pub(super) sh: Arc<Shared>,
    pub(super) phys: Arc<PhysMem>,
    pub(super) child: Option<JoinHandle<Vec<String>>>,
    /// Reservations owed while the child lives ([`Shared::owe`]).
    pub(super) child_owed: u64,
    /// Pins of processes that exited, for the coordinator.
    pub(super) strays: Vec<Pin>,
}

impl Worker {
    /// Runs `ops` random operations, then waits for the child; with
    /// `HUGETLB_STRESS_LOG` set, a failure prints what the process did.
    pub(super) fn run(mut self, ops: u64) -> (Proc, Vec<Pin>) {
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.ops(ops)));
        if let Err(e) = res {
            if std::env::var_os("HUGETLB_STRESS_LOG").is_some() {
                eprintln!("proc {} log:\n{}", self.p.slot, self.p.log.join("\n"));
            }
            std::panic::resume_unwind(e);
        }
        self.join_child();
        drop(self.cpu);
        let n = self.p.log.len();
        self.p.log.drain(..n.saturating_sub(300));
        (self.p, self.strays)
    }

    pub(super) fn ops(&mut self, ops: u64) {
        for _ in 0..ops {
            let maps: Vec<String> =
                self.p.maps.iter().map(|m| format!("{:?}@{:#x} f{} {:?}", m.kind, m.addr, m.file, m.slots)).collect();
            let owed = self.sh.owed_now();
            let pins: Vec<Target> = self.p.pins.iter().map(|p| p.target).collect();
            self.p.log.push(format!("maps {maps:?} pins {pins:?} owed {owed:?}"));
            let (name, op): (&str, fn(&mut Worker)) = match self.rng.below(100) {
                0..=21 => ("write", Worker::write),
                22..=31 => ("read", Worker::read),
                32..=45 => ("map", Worker::map),
                46..=52 => ("munmap", Worker::munmap),
                53..=60 => ("dontneed", Worker::dontneed),
                61..=68 => ("fork", Worker::fork),
                69..=79 => ("move_pages", Worker::move_pages),
                80..=89 => ("pin", Worker::pin),
                90..=97 => ("unpin", Worker::unpin),
                _ => ("respawn", Worker::respawn),
            };
            self.p.log.push(format!("{name}:"));
            op(self);
        }
    }

    pub(super) fn join_child(&mut self) {
        if let Some(h) = self.child.take() {
            let log = join_all(vec![h]).pop().unwrap();
            self.p.log.extend(log);
            self.p.log.push("  child joined".into());
        }
        for _ in 0..std::mem::take(&mut self.child_owed) {
            self.sh.repay();
        }
    }

    /// A random mapped slot: (mapping, page).
    pub(super) fn slot(&mut self) -> Option<(usize, usize)> {
        let all: Vec<(usize, usize)> = self
            .p
            .maps
            .iter()
            .enumerate()
            .flat_map(|(mi, m)| m.slots.iter().enumerate().filter_map(move |(i, s)| s.map(|_| (mi, i))))
            .collect();
        if all.is_empty() {
            return None;
        }
        Some(all[self.rng.below(all.len() as u64) as usize])
    }

    /// A zap by the owner of `uid`'s page: its reservation is owed to the
    /// pool while a child may still map the page or a pin holds it.
    pub(super) fn zapped(&mut self, st: PState) {
        if let PState::Anon { uid, .. } = st {
            if self.child.as_ref().is_some_and(|h| !h.is_finished()) {
                self.sh.owe();
                self.child_owed += 1;
            }
            if self.p.pinned(uid) && self.sh.owing.lock().unwrap().insert(uid) {
                self.sh.owe();
            }
        }
    }

    pub(super) fn write(&mut self) {
        let Some((mi, i)) = self.slot() else { return };
        bump(&self.sh.c.writes);
        let t = self.p.tag();
        let m = &self.p.maps[mi];
        let (base, what) = (m.base(i), m.what(i));
        let owed = self.sh.owed_now();
        if m.kind.private() {
            let st = m.slots[i].unwrap();
            let res = wr(&mut self.cpu, base, PRIV_LANE, t);
            self.p.log.push(format!("  write {what} ({st:?}): {res:?}"));
            let failed = res.is_err();
            match res {
                Ok(()) => {
                    let uid = match st {
                        PState::Anon { uid, .. } => uid,
                        _ => self.sh.id(),
                    };
                    self.p.maps[mi].slots[i] = Some(PState::Anon { uid, tag: t });
                }
                // A reserved fault finds the pool short only while a
                // reservation is owed back to it.
                Err(e) if is_bus(&e) && !matches!(st, PState::Anon { .. }) && self.sh.owed_since(owed) => {
                    bump(&self.sh.c.owner_bus)
                }
                Err(e) => panic!("{what}: owner's write ({st:?}): {e}"),
            }
            if failed {
                self.faulted_in(mi, i, true);
            }
        } else {
            let (key, idx) = (m.file, m.pgoff + i as u64);
            match wr(&mut self.cpu, base, self.p.slot as u64, t) {
                Ok(()) => self.sh.touch(key, idx, Some((self.p.slot, t))),
                Err(e) if is_bus(&e) && self.sh.owed_since(owed) => bump(&self.sh.c.owner_bus),
                Err(e) => panic!("{what}: shared write: {e}"),
            }
        }
    }

    pub(super) fn read(&mut self) {
        let Some((mi, i)) = self.slot() else { return };
        bump(&self.sh.c.reads);
        let m = &self.p.maps[mi];
        let (base, what, kind, key, idx, st) =
            (m.base(i), m.what(i), m.kind, m.file, m.pgoff + i as u64, m.slots[i].unwrap());
        let w = || what.clone();
        if !kind.private() {
            let want = self.sh.lane(key, idx, self.p.slot);
            let owed = self.sh.owed_now();
            match rd(&mut self.cpu, base, self.p.slot as u64, &w) {
                Ok(v) => {
                    assert_eq!(v, want, "{what}: this process's lane of a shared page");
                    self.sh.touch(key, idx, None);
                }
                Err(e) if is_bus(&e) && self.sh.owed_since(owed) => bump(&self.sh.c.owner_bus),
                Err(e) => panic!("{what}: shared read: {e}"),
            }
            return;
        }
        let precached = kind == Kind::PrivFile && self.precached(key) && idx == 0;
        let owed = self.sh.owed_now();
        match st {
            PState::Anon { tag, .. } => {
                let v = rd(&mut self.cpu, base, PRIV_LANE, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(v, tag, "{what}: a private page reads back what its process wrote last");
                if kind == Kind::PrivAnon {
                    self.zeroes(base, &what);
                }
            }
            PState::Cache => {
                let v = rd(&mut self.cpu, base, PRIV_LANE, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(v, 0, "{what}: the page-cache page mapped privately");
            }
            // A read of a page the file may or may not have in its cache
            // (another process's shared mapping may add it any time)
            // either maps that page or allocates: not modelled.
            PState::Empty if kind == Kind::PrivFile && !precached => {}
            PState::Empty => match rd(&mut self.cpu, base, PRIV_LANE, &w) {
                Ok(v) => {
                    assert_eq!(v, 0, "{what}: a new page is zeroed");
                    let new = if precached { PState::Cache } else { PState::Anon { uid: self.sh.id(), tag: 0 } };
                    if kind == Kind::PrivAnon {
                        self.zeroes(base, &what);
                    }
                    self.p.maps[mi].slots[i] = Some(new);
                }
                Err(e) if is_bus(&e) && !precached && self.sh.owed_since(owed) => bump(&self.sh.c.owner_bus),
                Err(e) => panic!("{what}: owner's read fault: {e}"),
            },
        }
    }

    /// The lanes of a private anonymous mapping's page are never written:
    /// zero, as the pool zeroes what it hands out.
    pub(super) fn zeroes(&mut self, base: u64, what: &str) {
        for lane in 0..LANES as u64 {
            let v = self.cpu.read_u64(word(base, 0, lane)).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(v, 0, "{what}: lane {lane} of a private anonymous page");
        }
    }

    pub(super) fn precached(&self, key: u64) -> bool {
        self.sh.model.lock().unwrap().files[&key].precached
    }

    pub(super) fn map(&mut self) {
        if self.p.maps.len() >= MAX_MAPS {
            return self.munmap();
        }
        bump(&self.sh.c.maps);
        let kind = pick(&mut self.rng, &[Kind::PrivAnon, Kind::PrivFile, Kind::SharedAnon, Kind::SharedFile]);
        let mm = &self.p.mm;
        let (res, key, pgoff, n) = match kind {
            Kind::PrivAnon | Kind::SharedAnon => {
                let n = 1 + self.rng.below(2);
                let share = if kind == Kind::PrivAnon { MAP_PRIVATE } else { MAP_SHARED };
                (mm.mmap(0, n * HP, RW, share | MAP_ANONYMOUS | MAP_HUGETLB, None, 0), 0, 0, n)
            }
            Kind::PrivFile | Kind::SharedFile => {
                let (key, file) = {
                    let m = self.sh.model.lock().unwrap();
                    let key = m.current[self.rng.below(FILES as u64) as usize];
                    (key, m.files[&key].file.clone().expect("a hugetlbfs file"))
                };
                let pgoff = self.rng.below(FILE_PAGES);
                let n = 1 + self.rng.below(FILE_PAGES - pgoff);
                let share = if kind == Kind::PrivFile { MAP_PRIVATE } else { MAP_SHARED };
                let huge = if self.rng.one_in(2) { MAP_HUGETLB } else { 0 };
                let open = OpenFile::read_write(&file);
                (mm.mmap(0, n * HP, RW, share | huge, Some(&open), pgoff * HP), key, pgoff, n)
            }
        };
        let addr = match res {
            Ok(a) => a,
            Err(Errno::NoMem) => return bump(&self.sh.c.map_enomem),
            Err(e) => panic!("mmap {kind:?} of {n} pages: {e}"),
        };
        let file = match kind {
            Kind::PrivAnon => 0,
            Kind::SharedAnon => {
                let key = self.sh.id();
                let f = FileModel {
                    file: None,
                    region: (0..n).collect(),
                    inst: BTreeSet::new(),
                    lanes: HashMap::new(),
                    precached: false,
                    current: false,
                };
                self.sh.model.lock().unwrap().files.insert(key, f);
                key
            }
            Kind::SharedFile => {
                self.sh.model.lock().unwrap().files.get_mut(&key).unwrap().region.extend(pgoff..pgoff + n);
                key
            }
            Kind::PrivFile => key,
        };
        let slots = vec![Some(PState::Empty); n as usize];
        self.p.maps.push(Mapping { addr, kind, file, pgoff, slots });
    }

    /// A random range `[i, j)` of pages of mapping `mi` that are all
    /// mapped (a hole may hold another mapping since), or with `whole` the
    /// longest such range around a random mapped page.
    pub(super) fn range(&mut self, mi: usize, whole: bool) -> (usize, usize) {
        let slots = &self.p.maps[mi].slots;
        let mapped: Vec<usize> = (0..slots.len()).filter(|&k| slots[k].is_some()).collect();
        let k = mapped[self.rng.below(mapped.len() as u64) as usize];
        let lo = (0..=k).rev().take_while(|&x| slots[x].is_some()).last().unwrap();
        let hi = (k..slots.len()).take_while(|&x| slots[x].is_some()).last().unwrap() + 1;
        if whole {
            return (lo, hi);
        }
        let i = lo + self.rng.below((hi - lo) as u64) as usize;
        let j = i + 1 + self.rng.below((hi - i) as u64) as usize;
        (i, j)
    }

    pub(super) fn munmap(&mut self) {
        if self.p.maps.is_empty() {
            return;
        }
        bump(&self.sh.c.munmaps);
        let mi = self.rng.below(self.p.maps.len() as u64) as usize;
        let whole = self.rng.one_in(2);
        let (i, j) = self.range(mi, whole);
        let m = &self.p.maps[mi];
        self.p.log.push(format!("  munmap {} pages [{i}, {j})", m.what(i)));
        self.p.mm.munmap(m.base(i), (j - i) as u64 * HP).unwrap_or_else(|e| panic!("munmap {}: {e}", m.what(i)));
        for k in i..j {
            if let Some(st) = self.p.maps[mi].slots[k].take() {
                self.zapped(st);
            }
        }
        if self.p.maps[mi].slots.iter().all(Option::is_none) {
            self.p.maps.remove(mi);
        }
    }

    pub(super) fn dontneed(&mut self) {
        if self.p.maps.is_empty() {
            return;
        }
        let mi = self.rng.below(self.p.maps.len() as u64) as usize;
        let (i, j) = self.range(mi, false);
        bump(&self.sh.c.dontneeds);
        let m = &self.p.maps[mi];
        let len = (j - i) as u64 * HP;
        self.p.mm.madvise(m.base(i), len, MADV_DONTNEED).unwrap_or_else(|e| panic!("MADV_DONTNEED {}: {e}", m.what(i)));
        if !m.kind.private() {
            return;
        }
        for k in i..j {
            let st = self.p.maps[mi].slots[k].unwrap();
            self.zapped(st);
            self.p.maps[mi].slots[k] = Some(PState::Empty);
        }
    }

    pub(super) fn fork(&mut self) {
        self.join_child();
        bump(&self.sh.c.forks);
        let child = match self.p.mm.fork() {
            Ok(c) => c,
            // copy_hugetlb_page_range copies a pinned page for the child
            // from outside the reservations: the pool may have none.
            Err(Errno::NoMem) if self.p.has_private_pins() => return bump(&self.sh.c.fork_enomem),
            Err(e) => panic!("fork: {e}"),
        };
        let maps: Vec<CMap> = self
            .p
            .maps
            .iter()
            .map(|m| CMap {
                addr: m.addr,
                kind: m.kind,
                file: m.file,
                pgoff: m.pgoff,
                slots: m
                    .slots
                    .iter()
                    .map(|s| {
                        s.map(|st| match st {
                            PState::Empty => CState::Empty,
                            PState::Cache => CState::Seen(0),
                            PState::Anon { tag, .. } => CState::Seen(tag),
                        })
                    })
                    .collect(),
            })
            .collect();
        let c = Child {
            mm: child,
            maps,
            lane: PROCS + self.p.slot,
            writer: self.sh.id(),
            seq: 0,
            sh: self.sh.clone(),
            rng: Rng::new(self.rng.next()),
        };
        self.child = Some(spawn(format!("child of {}", self.p.slot), move || c.run()));
    }

    pub(super) fn move_pages(&mut self) {
        let n = 1 + self.rng.below(3) as usize;
        let mut picked = Vec::new();
        for _ in 0..n {
            if let Some(s) = self.slot() {
                if !picked.contains(&s) {
                    picked.push(s);
                }
            }
        }
        if picked.is_empty() {
            return;
        }
        bump(&self.sh.c.move_calls);
        let addrs: Vec<u64> =
            picked.iter().map(|&(mi, i)| self.p.maps[mi].base(i) + self.rng.below(512) * 4096).collect();
        let nodes: Vec<i32> = picked.iter().map(|_| self.rng.below(NODES as u64) as i32).collect();
        let mut status = vec![i32::MIN; picked.len()];
        let res = self.p.mm.move_pages(&addrs, Some(&nodes), &mut status, MPOL_MF_MOVE_ALL);
        match res {
            Ok(0) => {}
            // Pinned or referenced meanwhile: left where they are.
            Ok(_) => bump(&self.sh.c.move_unmoved),
            // No free unreserved page on a target node.
            Err(Errno::NoMem) => bump(&self.sh.c.move_enomem),
            Err(e) => panic!("move_pages: {e}"),
        }
        for (k, &(mi, i)) in picked.iter().enumerate() {
            let m = &self.p.maps[mi];
            let st = m.slots[i].unwrap();
            let (s, node) = (status[k], nodes[k]);
            let what = m.what(i);
            match (m.kind.private(), st) {
                // Nothing mapped there: nothing to move.
                (true, PState::Empty) => assert!(s == -libc::ENOENT || s == i32::MIN, "{what}: empty, status {s}"),
                // Only this thread reaches its private anonymous pages.
                (true, PState::Anon { .. }) if res == Ok(0) => assert_eq!(s, node, "{what}: moved"),
                // A page-cache page: another process may add it, or be
                // moving it too.
                _ => assert!(
                    s == node || s == -libc::ENOENT || s == -libc::EBUSY || s == i32::MIN,
                    "{what}: status {s} for node {node}"
                ),
            }
            if s == node {
                bump(&self.sh.c.moved);
            }
            if let PState::Anon { tag, .. } = st {
                let w = || what.clone();
                let v = rd(&mut self.cpu, m.base(i), PRIV_LANE, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(v, tag, "{what}: data after move_pages");
                if s == node {
                    let mut q = [i32::MIN];
                    self.p.mm.move_pages(&[m.base(i)], None, &mut q, 0).unwrap();
                    assert_eq!(q[0], node, "{what}: the node move_pages reported");
                }
            }
        }
    }

    pub(super) fn pin(&mut self) {
        let Some((mi, i)) = self.slot() else { return };
        let flags = pick(&mut self.rng, &[Foll::empty(), Foll::WRITE, Foll::WRITE | Foll::LONGTERM, Foll::LONGTERM]);
        let npages = 1 + self.rng.below(3) as usize;
        let m = &self.p.maps[mi];
        let (base, what, kind, key, idx) = (m.base(i), m.what(i), m.kind, m.file, m.pgoff + i as u64);
        let st = m.slots[i].unwrap();
        let write = flags.contains(Foll::WRITE);
        let long = flags.contains(Foll::LONGTERM);
        let precached = kind == Kind::PrivFile && self.precached(key) && idx == 0;
        // A read of a private file page the cache may or may not hold: not modelled.
        if kind == Kind::PrivFile && st == PState::Empty && !write && !precached {
            return;
        }
        bump(&self.sh.c.pins);
        let owed = self.sh.owed_now();
        let res = self.p.mm.pin_user_pages(base, npages, flags);
        self.p.log.push(format!("  pin {what} ({st:?}) {npages} {flags:?}: {:?}", res.as_ref().map(|_| ())));
        let failed = match &res {
            Ok(_) => None,
            Err(Errno::Again) => Some(&self.sh.c.pin_eagain),
            // The fault's SIGBUS: a reserved fault while a reservation is owed.
            Err(Errno::Fault) if !matches!(st, PState::Anon { .. }) && self.sh.owed_since(owed) => {
                Some(&self.sh.c.pin_efault)
            }
            Err(e) => panic!("{what}: pin_user_pages({npages}, {flags:?}) ({st:?}): {e}"),
        };
        // A pin that failed may have faulted the page in first (a read
        // fault of a page-cache page whose unshare then found no page, a
        // fault before EAGAIN).
        let Ok(pin) = res else {
            bump(failed.expect("an expected failure"));
            return self.faulted_in(mi, i, write);
        };
        assert_eq!(pin.len(), npages);
        let mut buf = [0u8; 8];
        let w = || what.clone();
        if !kind.private() {
            let lane = self.p.slot as u64;
            if write {
                let t = self.p.tag();
                pin.write(lane * 8, &t.to_le_bytes()).unwrap();
                for sub in &SUBPAGES[1..] {
                    self.cpu.write_u64(word(base, *sub, lane), t).unwrap_or_else(|e| panic!("{what}: {e}"));
                }
                self.sh.touch(key, idx, Some((self.p.slot, t)));
            } else {
                self.sh.touch(key, idx, None);
            }
            let want = self.sh.lane(key, idx, self.p.slot);
            pin.read(lane * 8, &mut buf).unwrap();
            assert_eq!(u64::from_le_bytes(buf), want, "{what}: the device reads the page's lane");
            let v = rd(&mut self.cpu, base, lane, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(v, want, "{what}: the CPU reads what the device sees");
            self.p.pins.push(Pin { pages: pin, target: Target::Cache(key, idx) });
            return;
        }
        // Private: a write pin breaks COW, a long-term read pin of a
        // page-cache page unshares it (an anonymous copy), a short read pin
        // of one pins the cache's page.
        let (new, target) = match st {
            PState::Anon { uid, tag } if !write => (PState::Anon { uid, tag }, Target::Anon(uid)),
            PState::Cache | PState::Empty if !write && !long && kind == Kind::PrivFile => {
                (PState::Cache, Target::Cache(key, idx))
            }
            PState::Anon { uid, .. } => {
                let t = self.p.tag();
                (PState::Anon { uid, tag: t }, Target::Anon(uid))
            }
            _ => {
                let uid = self.sh.id();
                let tag = if write { self.p.tag() } else { 0 };
                (PState::Anon { uid, tag }, Target::Anon(uid))
            }
        };
        let want = match new {
            PState::Anon { tag, .. } => tag,
            _ => 0,
        };
        if write {
            pin.write(PRIV_LANE * 8, &want.to_le_bytes()).unwrap();
            for sub in &SUBPAGES[1..] {
                self.cpu
                    .write_u64(word(base, *sub, PRIV_LANE), want)
                    .unwrap_or_else(|e| panic!("{what}: write beside a write pin: {e}"));
            }
        }
        pin.read(PRIV_LANE * 8, &mut buf).unwrap();
        assert_eq!(u64::from_le_bytes(buf), want, "{what}: the device reads the pinned page ({st:?} -> {new:?})");
        let v = rd(&mut self.cpu, base, PRIV_LANE, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(v, want, "{what}: the CPU reads the pinned page ({st:?} -> {new:?}, {flags:?})");
        self.p.maps[mi].slots[i] = Some(new);
        self.p.pins.push(Pin { pages: pin, target });
    }

    /// After a failed access or pin of page `i` of mapping `mi`: whatever
    /// it faulted in before failing, now in the model (the page-cache page
    /// of a shared mapping; a private mapping's page-cache page for a read
    /// of a page the file holds for good, else an anonymous page, zeroed
    /// or a copy of the cache's, whose private lane is 0 either way).
    pub(super) fn faulted_in(&mut self, mi: usize, i: usize, write: bool) {
        let m = &self.p.maps[mi];
        let (key, idx) = (m.file, m.pgoff + i as u64);
        let mut vec = [0u8; 1];
        self.p.mm.mincore(m.base(i), 4096, &mut vec).unwrap();
        if vec[0] & 1 == 0 {
            return;
        }
        if !m.kind.private() {
            return self.sh.touch(key, idx, None);
        }
        if m.slots[i] == Some(PState::Empty) {
            let cache = m.kind == Kind::PrivFile && !write && idx == 0 && self.precached(key);
            let new = if cache { PState::Cache } else { PState::Anon { uid: self.sh.id(), tag: 0 } };
            self.p.log.push(format!("  faulted in before failing: {new:?}"));
            self.p.maps[mi].slots[i] = Some(new);
        }
    }

    pub(super) fn unpin(&mut self) {
        if self.p.pins.is_empty() {
            return;
        }
        bump(&self.sh.c.unpins);
        let k = self.rng.below(self.p.pins.len() as u64) as usize;
        let pin = self.p.pins.swap_remove(k);
        let how = if self.rng.one_in(2) { None } else { Some(self.rng.one_in(2)) };
        self.sh.unpin(&self.p.pins, pin, how);
    }

    /// The process exits (its pins live on) and a new one takes its slot.
    pub(super) fn respawn(&mut self) {
        self.join_child();
        bump(&self.sh.c.respawns);
        let all: Vec<PState> = self.p.maps.iter().flat_map(|m| m.slots.iter().flatten().copied()).collect();
        for st in all {
            self.zapped(st);
        }
        let new = Proc::new(&self.phys, self.p.slot, &self.sh, &mut self.rng);
        let old = std::mem::replace(&mut self.p, new);
        self.strays.extend(old.pins);
        self.cpu = Cpu::attached(&self.p.mm);
        drop(old.mm);
    }
}
