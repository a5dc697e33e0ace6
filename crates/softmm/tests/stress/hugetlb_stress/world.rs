//! The world and its checks

use super::*;

pub(super) struct World {
    pub(super) phys: Arc<PhysMem>,
    pub(super) sh: Arc<Shared>,
    pub(super) seed: u64,
    pub(super) procs: Vec<Proc>,
    /// Pins whose process exited.
    pub(super) strays: Vec<Pin>,
    pub(super) rng: Rng,
}

/// The stats reader: the pool's counts are consistent at every instant.
pub(super) fn watch_stats(phys: Arc<PhysMem>, stop: Arc<AtomicBool>, sh: Arc<Shared>) {
    let mut allocations = 0;
    loop {
        let done = stop.load(Relaxed);
        let s = phys.huge_page_stats();
        assert_eq!(s.total, TOTAL, "{s:?}");
        assert!(s.free <= s.total, "free > total: {s:?}");
        assert!(s.rsvd <= s.free, "rsvd > free: {s:?}");
        assert_eq!(s.surp, 0, "{s:?}");
        assert!(s.allocations >= allocations, "allocations went back: {s:?}");
        allocations = s.allocations;
        bump(&sh.c.stats_reads);
        if done {
            return;
        }
        thread::sleep(Duration::from_micros(200));
    }
}

impl World {
    pub(super) fn new(seed: u64) -> World {
        let small = 24 << 20;
        let bytes = NODES as u64 * (small + (HUGE_PER_NODE + 1) * HP);
        let phys = PhysMem::new(PhysConfig::new(bytes).nodes(NODES).hugepages(HUGE_PER_NODE)).expect("arena");
        let sh = Arc::new(Shared {
            model: Mutex::new(Model { files: HashMap::new(), current: [0; FILES] }),
            owed_active: AtomicI64::new(0),
            owed_events: AtomicU64::new(0),
            owing: Mutex::new(HashSet::new()),
            next_id: AtomicU64::new(1),
            c: Counters::default(),
        });
        let mut rng = Rng::new(seed);
        let procs = (0..PROCS).map(|slot| Proc::new(&phys, slot, &sh, &mut rng)).collect();
        let mut w = World { phys, sh, seed, procs, strays: Vec::new(), rng };
        for k in 0..FILES {
            w.new_file(k);
        }
        w
    }

    /// A new hugetlbfs file for slot `k` of the files rounds map; the old
    /// one lives on while mapped.
    pub(super) fn new_file(&mut self, k: usize) {
        let key = self.sh.id();
        let file = File::create_hugetlbfs(&self.phys, &format!("/stress-{key}"), FILE_PAGES * HP).unwrap();
        let mut f = FileModel {
            file: Some(file.clone()),
            region: BTreeSet::new(),
            inst: BTreeSet::new(),
            lanes: HashMap::new(),
            precached: false,
            current: true,
        };
        if self.rng.one_in(2) {
            match file.fallocate(0, 0, HP) {
                Ok(()) => {
                    f.precached = true;
                    f.region.insert(0);
                    f.inst.insert(0);
                }
                Err(Errno::NoSpc) => {}
                Err(e) => panic!("fallocate: {e}"),
            }
        }
        let mut m = self.sh.model.lock().unwrap();
        let old = m.current[k];
        if let Some(o) = m.files.get_mut(&old) {
            o.current = false;
        }
        m.current[k] = key;
        m.files.insert(key, f);
    }

    pub(super) fn round(&mut self, r: u64) {
        // Between rounds: replace a file now and then, let some pins of
        // exited processes go.
        for k in 0..FILES {
            if self.rng.one_in(4) {
                self.new_file(k);
            }
        }
        for k in (0..self.strays.len()).rev() {
            if self.rng.one_in(2) {
                let pin = self.strays.swap_remove(k);
                self.sh.unpin(&self.strays, pin, None);
            }
        }
        // Now and then, every pin of a page nothing maps goes: the pool
        // has every reservation back and the next check is exact.
        if self.rng.one_in(3) {
            self.strays.clear();
            for p in &mut self.procs {
                let live = p.live_uids();
                p.pins.retain(|pin| !matches!(pin.target, Target::Anon(u) if !live.contains(&u)));
            }
            let mut owing = self.sh.owing.lock().unwrap();
            for _ in owing.drain() {
                self.sh.repay();
            }
        }

        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (phys, stop, sh) = (self.phys.clone(), stop.clone(), self.sh.clone());
            spawn("stats".into(), move || watch_stats(phys, stop, sh))
        };
        let workers: Vec<_> = std::mem::take(&mut self.procs)
            .into_iter()
            .map(|p| {
                let rng = Rng::new(self.seed ^ (r << 20) ^ (p.slot as u64) << 8 ^ 0x9e37);
                let (sh, phys) = (self.sh.clone(), self.phys.clone());
                spawn(format!("proc {} round {r}", p.slot), move || {
                    let cpu = Cpu::attached(&p.mm);
                    Worker { p, cpu, rng, sh, phys, child: None, child_owed: 0, strays: Vec::new() }.run(OPS)
                })
            })
            .collect();
        let results = join_all(workers);
        stop.store(true, Relaxed);
        join_all(vec![watcher]);
        for (p, strays) in results {
            self.procs.push(p);
            self.strays.extend(strays);
        }
        self.check(r);
    }

    /// The model, for a failure's message.
    pub(super) fn dump(&self) -> String {
        let mut out = String::new();
        let live = self.live_uids();
        for p in &self.procs {
            out += &format!("proc {} (writer {}):\n", p.slot, p.writer);
            for m in &p.maps {
                out += &format!("  {:?} at {:#x} file {} pgoff {}: {:?}\n", m.kind, m.addr, m.file, m.pgoff, m.slots);
            }
            for pin in &p.pins {
                out += &format!(
                    "  pin {:?} live {}\n",
                    pin.target,
                    matches!(pin.target, Target::Anon(u) if live.contains(&u))
                );
            }
            if std::env::var_os("HUGETLB_STRESS_LOG").is_some() {
                out += &format!("  log:\n    {}\n", p.log.join("\n    "));
            }
        }
        for pin in &self.strays {
            out += &format!(
                "stray pin {:?} live {}\n",
                pin.target,
                matches!(pin.target, Target::Anon(u) if live.contains(&u))
            );
        }
        let model = self.sh.model.lock().unwrap();
        let mut keys: Vec<_> = model.files.keys().collect();
        keys.sort();
        for k in keys {
            let f = &model.files[k];
            out += &format!(
                "file {k} ({}): region {:?} inst {:?} precached {} current {}\n",
                if f.file.is_some() { "hugetlbfs" } else { "pseudo" },
                f.region,
                f.inst,
                f.precached,
                f.current
            );
        }
        out
    }

    pub(super) fn live_uids(&self) -> HashSet<Uid> {
        self.procs.iter().flat_map(|p| p.live_uids()).collect()
    }

    pub(super) fn pins(&self) -> impl Iterator<Item = &Pin> {
        self.procs.iter().flat_map(|p| p.pins.iter()).chain(self.strays.iter())
    }

    /// Drops the models (and handles) of files nothing maps any more, but
    /// the hugetlbfs files still handed out.
    pub(super) fn collect_files(&mut self) {
        let mapped: HashSet<u64> = self
            .procs
            .iter()
            .flat_map(|p| p.maps.iter())
            .filter(|m| m.kind != Kind::PrivAnon)
            .map(|m| m.file)
            .collect();
        let mut model = self.sh.model.lock().unwrap();
        model.files.retain(|k, f| f.current || mapped.contains(k));
    }

    /// After a round, its threads joined: the pool (`free <= total`, the
    /// nodes' sums, and free + pages in use == total, the pages in use
    /// counted without the pool), `HugePages_Rsvd` against the model's
    /// reservations (exact, or bounded while pins hold pages whose
    /// reservations the pool is owed), every mapping's data, that reading
    /// it allocated nothing, and the remap probe.
    pub(super) fn check(&mut self, r: u64) {
        let ctx = format!("round {r} (STRESS_SEED={})", self.seed);
        self.collect_files();
        // Deferred frees (page tables, old VMA trees) run at grace periods;
        // pages and reservations go before the calls that drop them return.
        grace_periods(&self.phys);
        let s = self.phys.huge_page_stats();
        assert!(s.free <= s.total && s.total == TOTAL, "{ctx}: {s:?}");
        let nodes = self.phys.huge_page_node_stats();
        assert_eq!(nodes.iter().map(|n| n.total).sum::<u64>(), s.total, "{ctx}: node totals");
        assert_eq!(nodes.iter().map(|n| n.free).sum::<u64>(), s.free, "{ctx}: node free pages");

        // Pages in use, counted without the pool: the page caches of live
        // files (File::cached_pages for hugetlbfs files; a pseudo-file has
        // no handle: its pages are the model's, checked below by mincore
        // and by reading them back without an allocation), the private
        // anonymous pages mapped (mincore), and the pages only pins hold
        // (no public API reaches a page nothing maps: the model's count).
        let dump = self.dump();
        let model = self.sh.model.lock().unwrap();
        let mut cached = 0;
        let mut rsvd = 0;
        for (key, f) in &model.files {
            if let Some(file) = &f.file {
                assert_eq!(file.cached_pages() as u64, f.inst.len() as u64, "{ctx}: file {key}'s page cache");
                for idx in 0..FILE_PAGES {
                    assert_eq!(file.is_cached(idx), f.inst.contains(&idx), "{ctx}: file {key} index {idx} cached");
                }
            }
            assert!(f.inst.is_subset(&f.region), "{ctx}: file {key}: an instantiated page outside the region map");
            cached += f.inst.len() as u64;
            rsvd += (f.region.len() - f.inst.len()) as u64;
        }
        let mut private = 0;
        for p in &self.procs {
            let mut hugetlb_pages = 0;
            for m in &p.maps {
                for (i, st) in m.slots.iter().enumerate() {
                    let Some(st) = st else { continue };
                    let mut vec = vec![0u8; 512];
                    p.mm.mincore(m.base(i), HP, &mut vec).unwrap();
                    let present = vec[0] & 1 == 1;
                    assert!(
                        vec.iter().all(|&b| b & 1 == vec[0] & 1),
                        "{ctx}: {}: mincore of part of a huge page",
                        m.what(i)
                    );
                    hugetlb_pages += present as u64 * 512;
                    let what = m.what(i);
                    if m.kind.private() {
                        let want = !matches!(st, PState::Empty);
                        assert_eq!(present, want, "{ctx}: proc {} {what}: mapped ({st:?})\n{dump}", p.slot);
                        match st {
                            PState::Anon { .. } => private += 1,
                            // The reservation of a page not (privately) allocated.
                            _ => rsvd += 1,
                        }
                    } else if present {
                        let idx = m.pgoff + i as u64;
                        assert!(
                            model.files[&m.file].inst.contains(&idx),
                            "{ctx}: proc {} {what}: mapped, not instantiated",
                            p.slot
                        );
                    }
                }
            }
            assert_eq!(
                p.mm.stats().hugetlb_pages,
                hugetlb_pages,
                "{ctx}: proc {}: HugetlbPages against mincore",
                p.slot
            );
        }
        let live = self.live_uids();
        let orphans: HashSet<Target> = self
            .pins()
            .map(|p| p.target)
            .filter(|t| match *t {
                Target::Anon(u) => !live.contains(&u),
                Target::Cache(key, _) => !model.files.contains_key(&key),
            })
            .collect();
        let pending = orphans.iter().filter(|t| matches!(t, Target::Anon(_))).count() as u64;
        let in_use = cached + private + orphans.len() as u64;
        assert_eq!(
            s.free + in_use,
            s.total,
            "{ctx}: free {} + in use {in_use} (cached {cached}, private {private}, only pinned {}) != total: {s:?}\n{dump}",
            s.free,
            orphans.len()
        );
        // HugePages_Rsvd: exact, but for the reservations an owner's zap
        // gave back to its map while a pin still holds the page: the pool
        // has them only when the page is freed (Linux's restore flag), and
        // whether a zap by munmap or exit owes one (Linux: yes, the close
        // unreserves first) is not asserted: a bound.
        if pending == 0 {
            assert_eq!(s.rsvd, rsvd, "{ctx}: HugePages_Rsvd against the model: {s:?}\n{dump}");
        } else {
            bump(&self.sh.c.owed_bounded);
            assert!(
                s.rsvd <= rsvd && s.rsvd >= rsvd.saturating_sub(pending),
                "{ctx}: HugePages_Rsvd {} outside [{} - {pending}, {rsvd}]: {s:?}\n{dump}",
                s.rsvd,
                rsvd
            );
        }
        drop(model);

        self.check_data(&ctx);
        let after = self.phys.huge_page_stats();
        assert_eq!((after.free, after.rsvd), (s.free, s.rsvd), "{ctx}: reading the data allocated: {s:?} -> {after:?}");
        // With a reservation owed, the pool promises more than it holds.
        if pending == 0 {
            self.remap_probe(&ctx);
        }
    }

    /// Every private page reads back its process's last tag (so no two
    /// private mappings share a frame after a write, and no child's write
    /// shows in its parent), every shared page every lane's last write,
    /// through the mappings and, for hugetlbfs files, `File::read_at`.
    pub(super) fn check_data(&self, ctx: &str) {
        let model = self.sh.model.lock().unwrap();
        for p in &self.procs {
            let mut cpu = Cpu::attached(&p.mm);
            for m in &p.maps {
                for (i, st) in m.slots.iter().enumerate() {
                    let Some(st) = st else { continue };
                    let what = format!("{ctx}: proc {} {}", p.slot, m.what(i));
                    let w = || what.clone();
                    let base = m.base(i);
                    if m.kind.private() {
                        let want = match st {
                            PState::Anon { tag, .. } => *tag,
                            PState::Cache => 0,
                            PState::Empty => continue,
                        };
                        let v = rd(&mut cpu, base, PRIV_LANE, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_eq!(v, want, "{what}: private data ({st:?})");
                        if m.kind == Kind::PrivAnon {
                            for lane in 0..LANES as u64 {
                                assert_eq!(cpu.read_u64(word(base, 0, lane)), Ok(0), "{what}: lane {lane}");
                            }
                        }
                        let mut q = [i32::MIN];
                        p.mm.move_pages(&[base], None, &mut q, 0).unwrap();
                        assert!((0..NODES as i32).contains(&q[0]), "{what}: node {}", q[0]);
                        continue;
                    }
                    let f = &model.files[&m.file];
                    let idx = m.pgoff + i as u64;
                    if !f.inst.contains(&idx) {
                        continue;
                    }
                    let lanes = f.lanes.get(&idx).copied().unwrap_or_default();
                    for (lane, want) in lanes.iter().enumerate() {
                        let v = rd(&mut cpu, base, lane as u64, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_eq!(v, *want, "{what}: shared lane {lane}");
                    }
                    assert_eq!(cpu.read_u64(word(base, 0, PRIV_LANE)), Ok(0), "{what}: a shared page's private lane");
                }
            }
        }
        for (key, f) in model.files.iter() {
            let Some(file) = &f.file else { continue };
            for &idx in &f.inst {
                let lanes = f.lanes.get(&idx).copied().unwrap_or_default();
                for (lane, want) in lanes.iter().enumerate() {
                    for sub in SUBPAGES {
                        let mut buf = [0u8; 8];
                        file.read_at(word(idx * HP, sub, lane as u64), &mut buf).unwrap();
                        assert_eq!(
                            u64::from_le_bytes(buf),
                            *want,
                            "{ctx}: file {key} index {idx} lane {lane} (read_at)"
                        );
                    }
                }
            }
        }
    }

    /// What the pool can still promise is mapped shared and anonymous,
    /// touched, unmapped, and mapped again: the second `mmap` needs what
    /// the first `munmap` released, before it returned.
    pub(super) fn remap_probe(&mut self, ctx: &str) {
        let s = self.phys.huge_page_stats();
        let n = s.free - s.rsvd;
        if n == 0 {
            return;
        }
        bump(&self.sh.c.remap_probes);
        let mm = self.procs[0].mm.clone();
        let flags = MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB;
        let a = mm.mmap(0, n * HP, RW, flags, None, 0).unwrap_or_else(|e| panic!("{ctx}: {n} pages of {s:?}: {e}"));
        let mut cpu = Cpu::attached(&mm);
        for i in 0..n {
            cpu.write_u64(a + i * HP, i + 1).unwrap();
        }
        mm.munmap(a, n * HP).unwrap();
        let now = self.phys.huge_page_stats();
        assert_eq!((now.free, now.rsvd), (s.free, s.rsvd), "{ctx}: munmap released the probe's pages");
        match mm.mmap(0, n * HP, RW, flags, None, 0) {
            Ok(b) => {
                for i in 0..n {
                    assert_eq!(cpu.read_u64(b + i * HP), Ok(0), "{ctx}: a new shared anonymous mapping is zeroed");
                }
                mm.munmap(b, n * HP).unwrap();
            }
            Err(e) => panic!("{ctx}: {n} shared anonymous pages mapped again after munmap: {e}"),
        }
        drop(cpu);
        grace_periods(&self.phys);
        let now = self.phys.huge_page_stats();
        assert_eq!((now.free, now.rsvd), (s.free, s.rsvd), "{ctx}: the probe left pages behind");
    }

    pub(super) fn finish(mut self) {
        // Exit in a random order, some pins going before their process.
        while !self.procs.is_empty() {
            let k = self.rng.below(self.procs.len() as u64) as usize;
            let p = self.procs.swap_remove(k);
            if self.rng.one_in(2) {
                drop(p.pins);
                drop(p.mm);
            } else {
                drop(p.mm);
                drop(p.pins);
            }
        }
        self.strays.clear();
        self.sh.model.lock().unwrap().files.clear();
        let c = &self.sh.c;
        let g = |x: &AtomicU64| x.load(Relaxed);
        eprintln!(
            "hugetlb_stress: writes {} reads {} maps {} (ENOMEM {}) munmaps {} dontneeds {} forks {} (ENOMEM {}) \
             child ops {} (SIGBUS {}) owner SIGBUS {} move_pages {} (moved {}, ENOMEM {}, unmoved {}) pins {} \
             (EAGAIN {}, EFAULT {}) unpins {} respawns {} stats reads {} remap probes {} rsvd bounded {}",
            g(&c.writes),
            g(&c.reads),
            g(&c.maps),
            g(&c.map_enomem),
            g(&c.munmaps),
            g(&c.dontneeds),
            g(&c.forks),
            g(&c.fork_enomem),
            g(&c.child_ops),
            g(&c.child_bus),
            g(&c.owner_bus),
            g(&c.move_calls),
            g(&c.moved),
            g(&c.move_enomem),
            g(&c.move_unmoved),
            g(&c.pins),
            g(&c.pin_eagain),
            g(&c.pin_efault),
            g(&c.unpins),
            g(&c.respawns),
            g(&c.stats_reads),
            g(&c.remap_probes),
            g(&c.owed_bounded),
        );
        assert_no_leaks(&self.phys);
    }
}
