//! MMIO regions (`AddressSpace::mmap_io`, `crate::mmio`): a device serves
//! the loads, stores and copies of every size, from a CPU and a section,
//! with the calls it gets (one per scalar, aligned pieces per copy); the
//! calls that need host memory get `Fault::Mmio`; protections, watchpoints;
//! Linux's `VM_IO | VM_PFNMAP` answers (mremap, madvise, mlock, populate,
//! pins, remote access, maps); bad input; several guest threads; a
//! concurrent munmap (every callback returns before it does); a callback
//! that blocks holds up no other thread's shootdown; fork.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use softmm::uapi::*;
use softmm::{Access, AddressSpace, Cpu, Errno, Fault, Foll, MmConfig, MmioDevice, PhysMem, SegvCode, WatchAccess};
use softmm_testkit::common::{assert_no_leaks, last_fault, phys, watchdog, ANON, PAGE, RW};

const SHARED: i32 = MAP_SHARED;

/// A device of plain registers: `size` bytes of storage, every call logged.
struct Regs {
    bytes: Mutex<Vec<u8>>,
    log: Mutex<Vec<(char, u64, usize)>>,
}

impl Regs {
    fn new(size: usize) -> Arc<Regs> {
        Arc::new(Regs { bytes: Mutex::new(vec![0; size]), log: Mutex::new(Vec::new()) })
    }

    /// The calls since the last `take`.
    fn take(&self) -> Vec<(char, u64, usize)> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

impl MmioDevice for Regs {
    fn read(&self, offset: u64, size: usize) -> u64 {
        self.log.lock().unwrap().push(('r', offset, size));
        let b = self.bytes.lock().unwrap();
        let mut v = [0; 8];
        v[..size].copy_from_slice(&b[offset as usize..offset as usize + size]);
        u64::from_le_bytes(v)
    }

    fn write(&self, offset: u64, size: usize, value: u64) {
        self.log.lock().unwrap().push(('w', offset, size));
        self.bytes.lock().unwrap()[offset as usize..offset as usize + size]
            .copy_from_slice(&value.to_le_bytes()[..size]);
    }

    fn name(&self) -> &str {
        "/dev/regs"
    }
}

fn setup() -> (Arc<PhysMem>, Arc<AddressSpace>) {
    let p = phys(1);
    let mm = AddressSpace::new(&p, MmConfig::default()).unwrap();
    (p, mm)
}

/// Every scalar width, aligned or not, through a CPU and a section, is one
/// call of its size at its offset; a copy is its aligned pieces; a scalar
/// across two pages of the region is one call per page.
#[test]
fn an_mmio_region_serves_loads_stores_and_copies_of_every_size() {
    let (p, mm) = setup();
    let dev = Regs::new(2 * PAGE as usize);
    let io = mm.mmap_io(0, 2 * PAGE, RW, SHARED, dev.clone()).unwrap();
    let mut cpu = Cpu::attached(&mm);
    for off in [0u64, 8, 3, 13] {
        cpu.write_u8(io + off, 0x11).unwrap();
        cpu.write_u16(io + off, 0x2233).unwrap();
        cpu.write_u32(io + off, 0x4455_6677).unwrap();
        cpu.write_u64(io + off, 0x8899_aabb_ccdd_eeff).unwrap();
        assert_eq!(cpu.read_u8(io + off), Ok(0xff));
        assert_eq!(cpu.read_u16(io + off), Ok(0xeeff));
        assert_eq!(cpu.read_u32(io + off), Ok(0xccdd_eeff));
        assert_eq!(cpu.read_u64(io + off), Ok(0x8899_aabb_ccdd_eeff));
        assert_eq!(cpu.read_be::<u16>(io + off), Ok(0xffee));
        let calls = dev.take();
        let want: Vec<_> = [('w', 1), ('w', 2), ('w', 4), ('w', 8), ('r', 1), ('r', 2), ('r', 4), ('r', 8), ('r', 2)]
            .into_iter()
            .map(|(k, n)| (k, off, n))
            .collect();
        assert_eq!(calls, want, "offset {off}");
    }
    // A section's accesses, and the page offset inside the region.
    {
        let mut s = cpu.section();
        s.write_u32(io + PAGE + 4, 9).unwrap();
        assert_eq!(s.read_u32(io + PAGE + 4), Ok(9));
        assert_eq!(s.read_u64(io + PAGE), Ok(9 << 32));
    }
    assert_eq!(dev.take(), [('w', PAGE + 4, 4), ('r', PAGE + 4, 4), ('r', PAGE, 8)]);
    // A copy: the naturally aligned pieces of at most 8 bytes.
    let data: Vec<u8> = (1..=16).collect();
    cpu.write(io + 3, &data).unwrap();
    assert_eq!(dev.take(), [('w', 3, 1), ('w', 4, 4), ('w', 8, 8), ('w', 16, 2), ('w', 18, 1)]);
    let mut back = [0; 16];
    cpu.read(io + 3, &mut back).unwrap();
    assert_eq!(back.to_vec(), data);
    assert_eq!(dev.take(), [('r', 3, 1), ('r', 4, 4), ('r', 8, 8), ('r', 16, 2), ('r', 18, 1)]);
    // A scalar across the region's two pages: one call per page.
    cpu.write_u32(io + PAGE - 2, 0x0403_0201).unwrap();
    assert_eq!(cpu.read_u32(io + PAGE - 2), Ok(0x0403_0201));
    assert_eq!(dev.take(), [('w', PAGE - 2, 2), ('w', PAGE, 2), ('r', PAGE - 2, 2), ('r', PAGE, 2)]);
    drop((cpu, mm));
    assert_no_leaks(&p);
}

/// No host address: a probe, a held translation, a slice and an atomic get
/// `Fault::Mmio` and call nothing; the region's protection is checked
/// (`SEGV_ACCERR`), and a watchpoint stops a device access before it is made.
#[test]
fn calls_that_need_host_memory_get_fault_mmio_and_protections_hold() {
    let (p, mm) = setup();
    let dev = Regs::new(PAGE as usize);
    let io = mm.mmap_io(0, PAGE, PROT_READ, SHARED, dev.clone()).unwrap();
    let mut cpu = Cpu::attached(&mm);
    let mmio = Fault::Mmio { addr: io + 8 };
    assert_eq!(cpu.section().probe(io + 8, 8, Access::Read).err(), Some(mmio));
    assert_eq!(cpu.translate(io + 8, Access::Read).err(), Some(mmio));
    assert_eq!(cpu.with_slice(io + 8, 4, |_, _| ()), Err(mmio));
    assert_eq!(cpu.atomic_load::<u64>(io + 8, Ordering::Relaxed), Err(mmio));
    assert_eq!(last_fault(&cpu), (Access::Read, io + 8, 8));
    assert_eq!(mmio.signal(), 0);
    assert_eq!(dev.take(), []);
    // Read-only, not executable.
    assert_eq!(cpu.write_u32(io, 1), Err(Fault::Segv { addr: io, code: SegvCode::AccErr }));
    assert_eq!(cpu.fetch_u32(io), Err(Fault::Segv { addr: io, code: SegvCode::AccErr }));
    assert_eq!(cpu.read_u32(io), Ok(0));
    assert_eq!(dev.take(), [('r', 0, 4)]);
    mm.mprotect(io, PAGE, RW).unwrap();
    assert_eq!(cpu.write_u32(io, 1), Ok(()));
    // A watchpoint, then passed once.
    mm.watchpoint_insert(io + 16, 4, WatchAccess::WRITE).unwrap();
    dev.take();
    assert_eq!(cpu.write_u64(io + 16, 5), Err(Fault::Watchpoint { addr: io + 16 }));
    assert_eq!(dev.take(), []);
    cpu.pass_watchpoint();
    assert_eq!(cpu.write_u64(io + 16, 5), Ok(()));
    assert_eq!(cpu.write_u8(io + 17, 5), Err(Fault::Watchpoint { addr: io + 17 }));
    assert_eq!(dev.take(), [('w', 16, 8)]);
    drop((cpu, mm));
    assert_no_leaks(&p);
}

/// Linux's `VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP` answers.
#[test]
fn an_mmio_region_gets_linux_vm_io_answers() {
    let (p, mm) = setup();
    let dev = Regs::new(4 * PAGE as usize);
    let io = mm.mmap_io(0, 2 * PAGE, RW, SHARED | MAP_POPULATE | MAP_LOCKED, dev.clone()).unwrap();
    let line = mm.maps().into_iter().find(|e| e.start == io).unwrap();
    assert_eq!((line.end, line.perms.as_str(), line.name.as_str(), line.rss), (io + 2 * PAGE, "rw-s", "/dev/regs", 0));
    for f in ["io", "pf", "de", "dd"] {
        assert!(line.vm_flags.split(' ').any(|x| x == f), "{f} in {:?}", line.vm_flags);
    }
    assert!(!line.vm_flags.split(' ').any(|x| x == "lo"), "never locked: {:?}", line.vm_flags);
    assert_eq!(dev.take(), [], "populate skips device memory");
    // mremap: no growth, no DONTUNMAP; a move keeps the device offsets.
    assert_eq!(mm.mremap(io, PAGE, 2 * PAGE, 0, 0), Err(Errno::Fault));
    assert_eq!(mm.mremap(io, 2 * PAGE, 3 * PAGE, MREMAP_MAYMOVE, 0), Err(Errno::Fault));
    assert_eq!(mm.mremap(io, PAGE, PAGE, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0), Err(Errno::Inval));
    // madvise.
    for (advice, e) in [
        (MADV_DONTNEED, Errno::Inval),
        (MADV_DOFORK, Errno::Inval),
        (MADV_DODUMP, Errno::Inval),
        (MADV_POPULATE_READ, Errno::Inval),
        (MADV_POPULATE_WRITE, Errno::Inval),
        (MADV_REMOVE, Errno::NoDev),
    ] {
        assert_eq!(mm.madvise(io, PAGE, advice), Err(e), "advice {advice}");
    }
    assert_eq!(mm.mlock(io, 2 * PAGE), Ok(()));
    assert_eq!(mm.pin_user_pages(io, 1, Foll::WRITE).err(), Some(Errno::Fault));
    assert_eq!(mm.get_user_pages(io, 1, Foll::empty()).err(), Some(Errno::Fault));
    let mut buf = [0; 8];
    assert_eq!(mm.access_remote_read(io, &mut buf, true), 0, "no vm_ops->access: EIO");
    assert_eq!(mm.access_remote_write(io, &buf, true), 0);
    assert_eq!(dev.take(), []);
    let moved = mm.mremap(io + PAGE, PAGE, PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, io + 8 * PAGE).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u8(moved + 1, 7).unwrap();
    assert_eq!(dev.take(), [('w', PAGE + 1, 1)]);
    assert_eq!(cpu.read_u8(io + PAGE), Err(Fault::Segv { addr: io + PAGE, code: SegvCode::MapErr }));
    drop((cpu, mm));
    assert_no_leaks(&p);
}

/// Bad input gets `mmap`'s errno and changes nothing; a hint over a
/// mapping is placed elsewhere; `MAP_FIXED` replaces.
#[test]
fn bad_mmio_input_gets_linux_errnos_and_changes_nothing() {
    let (p, mm) = setup();
    let dev = Regs::new(4 * PAGE as usize);
    let anon = mm.mmap(0, 2 * PAGE, RW, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(anon, 42).unwrap();
    let before = mm.maps();
    let d = || dev.clone() as Arc<dyn MmioDevice>;
    assert_eq!(mm.mmap_io(0, 0, RW, SHARED, d()), Err(Errno::Inval), "len 0");
    assert_eq!(mm.mmap_io(anon + 1, PAGE, RW, SHARED | MAP_FIXED, d()), Err(Errno::Inval), "unaligned");
    assert_eq!(mm.mmap_io(0, PAGE, RW, MAP_PRIVATE, d()), Err(Errno::Inval), "private");
    assert_eq!(mm.mmap_io(0, PAGE, RW, SHARED | MAP_ANONYMOUS, d()), Err(Errno::Inval), "anonymous");
    assert_eq!(mm.mmap_io(0, PAGE, RW, 0, d()), Err(Errno::Inval), "no type");
    assert_eq!(mm.mmap_io(anon, PAGE, RW, SHARED | MAP_FIXED_NOREPLACE, d()), Err(Errno::Exist));
    assert_eq!(mm.mmap_io(0, u64::MAX - PAGE, RW, SHARED, d()), Err(Errno::NoMem));
    assert_eq!(mm.maps(), before);
    assert_eq!(cpu.read_u64(anon), Ok(42));
    // A hint over the anonymous mapping: placed elsewhere.
    let io = mm.mmap_io(anon, PAGE, RW, SHARED, d()).unwrap();
    assert_ne!(io, anon);
    assert_eq!(cpu.read_u64(anon), Ok(42));
    mm.munmap(io, PAGE).unwrap();
    assert_eq!(mm.maps(), before);
    // MAP_FIXED replaces the anonymous page.
    assert_eq!(mm.mmap_io(anon, PAGE, RW, SHARED | MAP_FIXED, d()), Ok(anon));
    assert_eq!(cpu.read_u64(anon), Ok(0));
    assert_eq!(dev.take(), [('r', 0, 8)]);
    drop((cpu, mm));
    assert_no_leaks(&p);
}

/// A device that counts, and checks that no callback runs once the region
/// is gone.
struct Counter {
    value: AtomicU64,
    calls: AtomicU64,
    /// Set by the test once its munmap returned.
    unmapped: AtomicBool,
    /// A callback ran, or was still running, after that.
    late: AtomicBool,
}

impl MmioDevice for Counter {
    fn read(&self, _offset: u64, _size: usize) -> u64 {
        self.check();
        let v = self.value.load(Ordering::SeqCst);
        std::thread::yield_now();
        self.check();
        v
    }

    fn write(&self, _offset: u64, _size: usize, value: u64) {
        self.check();
        self.value.fetch_add(value, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::yield_now();
        self.check();
    }
}

impl Counter {
    fn new() -> Arc<Counter> {
        Arc::new(Counter {
            value: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            unmapped: AtomicBool::new(false),
            late: AtomicBool::new(false),
        })
    }

    fn check(&self) {
        if self.unmapped.load(Ordering::SeqCst) {
            self.late.store(true, Ordering::SeqCst);
        }
    }
}

/// Several guest threads store through one region: every store reaches the
/// device once. Then a munmap while they run: they end on `SEGV_MAPERR`, and
/// no callback runs, or is still running, after the munmap returned.
#[test]
fn guest_threads_share_a_region_and_every_callback_returns_before_munmap() {
    let (p, mm) = setup();
    let dev = Counter::new();
    let io = mm.mmap_io(0, PAGE, RW, SHARED, dev.clone()).unwrap();
    const THREADS: u64 = 4;
    const STORES: u64 = 500;
    let mut hs = Vec::new();
    for t in 0..THREADS {
        let mm = mm.clone();
        hs.push(std::thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            for _ in 0..STORES {
                cpu.write_u32(io + 4 * t, 1).unwrap();
            }
        }));
    }
    hs.into_iter().for_each(|h| h.join().unwrap());
    assert_eq!(dev.value.load(Ordering::SeqCst), THREADS * STORES);
    let (started_tx, started_rx) = mpsc::channel();
    let mut hs = Vec::new();
    for t in 0..THREADS {
        let (mm, started_tx) = (mm.clone(), started_tx.clone());
        hs.push(std::thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            started_tx.send(()).unwrap();
            loop {
                let r = if t % 2 == 0 { cpu.write_u64(io + 8, 1) } else { cpu.read_u64(io).map(drop) };
                match r {
                    Ok(()) => {}
                    Err(f) => return f,
                }
            }
        }));
    }
    (0..THREADS).for_each(|_| started_rx.recv().unwrap());
    while dev.calls.load(Ordering::SeqCst) < THREADS * STORES + 100 {
        std::thread::yield_now();
    }
    mm.munmap(io, PAGE).unwrap();
    dev.unmapped.store(true, Ordering::SeqCst);
    for (t, h) in hs.into_iter().enumerate() {
        let addr = if t % 2 == 0 { io + 8 } else { io };
        assert_eq!(h.join().unwrap(), Fault::Segv { addr, code: SegvCode::MapErr });
    }
    assert!(!dev.late.load(Ordering::SeqCst), "a callback ran after munmap returned");
    drop(mm);
    assert_no_leaks(&p);
}

/// A callback that blocks holds up no other thread's shootdown (it runs out
/// of any access section): here it waits for a munmap, on another thread,
/// of a page its own CPU has cached, which would wait forever for an open
/// section. It may also use another address space.
#[test]
fn a_blocking_callback_holds_up_no_shootdown() {
    struct Gate {
        entered: Mutex<Option<mpsc::Sender<()>>>,
        release: Mutex<mpsc::Receiver<()>>,
        other: Arc<AddressSpace>,
        other_addr: u64,
    }
    impl MmioDevice for Gate {
        fn read(&self, _offset: u64, _size: usize) -> u64 {
            if let Some(tx) = self.entered.lock().unwrap().take() {
                tx.send(()).unwrap();
                self.release.lock().unwrap().recv().unwrap();
            }
            Cpu::attached(&self.other).read_u64(self.other_addr).unwrap()
        }
        fn write(&self, _offset: u64, _size: usize, _value: u64) {}
    }
    watchdog("mmio-blocking-callback", 60, || {
        let (p, mm) = setup();
        let other = AddressSpace::new(&p, MmConfig::default()).unwrap();
        let other_addr = other.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        Cpu::attached(&other).write_u64(other_addr, 77).unwrap();
        let (entered_tx, entered_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel();
        let gate = Arc::new(Gate {
            entered: Mutex::new(Some(entered_tx)),
            release: Mutex::new(release_rx),
            other: other.clone(),
            other_addr,
        });
        let io = mm.mmap_io(0, PAGE, RW, SHARED, gate).unwrap();
        let ram = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        let guest = {
            let mm = mm.clone();
            std::thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                let mut s = cpu.section();
                s.write_u64(ram, 1).unwrap();
                // Blocks in the callback, inside the section.
                let v = s.read_u64(io).unwrap();
                (v, s.read_u64(ram))
            })
        };
        entered_rx.recv().unwrap();
        mm.munmap(ram, PAGE).unwrap();
        release_tx.send(()).unwrap();
        let (v, after) = guest.join().unwrap();
        assert_eq!(v, 77);
        assert_eq!(after, Err(Fault::Segv { addr: ram, code: SegvCode::MapErr }));
        drop((mm, other));
        assert_no_leaks(&p);
    });
}

/// fork copies the mapping: the child's accesses reach the same device; the
/// child's munmap leaves the parent's region.
#[test]
fn fork_copies_an_mmio_region_to_the_same_device() {
    let (p, mm) = setup();
    let dev = Regs::new(PAGE as usize);
    let io = mm.mmap_io(0, PAGE, RW, SHARED, dev.clone()).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u32(io, 5).unwrap();
    let child = mm.fork().unwrap();
    let mut ccpu = Cpu::attached(&child);
    assert_eq!(ccpu.read_u32(io), Ok(5));
    ccpu.write_u32(io + 4, 6).unwrap();
    assert_eq!(cpu.read_u32(io + 4), Ok(6));
    assert_eq!(dev.take(), [('w', 0, 4), ('r', 0, 4), ('w', 4, 4), ('r', 4, 4)]);
    assert_eq!(child.maps().into_iter().find(|e| e.start == io).map(|e| e.name), Some("/dev/regs".into()));
    child.munmap(io, PAGE).unwrap();
    assert_eq!(cpu.read_u32(io), Ok(5));
    drop((ccpu, child, cpu, mm));
    assert_no_leaks(&p);
}

/// softmm drops the device in the call that removes its last mapping,
/// fork's copy included, and never before.
#[test]
fn the_device_is_dropped_with_its_last_mapping() {
    struct Dropped(Arc<AtomicBool>);
    impl MmioDevice for Dropped {
        fn read(&self, _offset: u64, _size: usize) -> u64 {
            assert!(!self.0.load(Ordering::SeqCst));
            1
        }
        fn write(&self, _offset: u64, _size: usize, _value: u64) {}
    }
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let (p, mm) = setup();
    let dropped = Arc::new(AtomicBool::new(false));
    let io = mm.mmap_io(0, 2 * PAGE, RW, SHARED, Arc::new(Dropped(dropped.clone()))).unwrap();
    let child = mm.fork().unwrap();
    mm.munmap(io, PAGE).unwrap();
    mm.munmap(io + PAGE, PAGE).unwrap();
    assert!(!dropped.load(Ordering::SeqCst), "the child still maps it");
    assert_eq!(Cpu::attached(&child).read_u8(io + PAGE), Ok(1));
    drop(child);
    assert!(dropped.load(Ordering::SeqCst), "gone with the child");
    // A failed mapping drops its device at once.
    let failed = Arc::new(AtomicBool::new(false));
    assert_eq!(mm.mmap_io(0, 0, RW, SHARED, Arc::new(Dropped(failed.clone()))), Err(Errno::Inval));
    assert!(failed.load(Ordering::SeqCst));
    drop(mm);
    assert_no_leaks(&p);
}

thread_local! {
    /// The DMA engine's CPU of [`ADmaEngine`], made at its first call and kept.
    static DMA_CPU: std::cell::RefCell<Option<Cpu>> = const { std::cell::RefCell::new(None) };
}

/// A device that, at a read of its register, reads guest memory of another
/// address space through a CPU of its own, made at its first call on the
/// guest thread and kept there (a DMA engine made lazily).
struct ADmaEngine {
    other: Arc<AddressSpace>,
    at: u64,
}

impl MmioDevice for ADmaEngine {
    fn read(&self, _offset: u64, _size: usize) -> u64 {
        DMA_CPU.with(|c| {
            let mut c = c.borrow_mut();
            c.get_or_insert_with(|| Cpu::attached(&self.other)).read_u64(self.at).unwrap_or(u64::MAX)
        })
    }

    fn write(&self, _offset: u64, _size: usize, _value: u64) {}

    fn name(&self) -> &str {
        "/dev/dma"
    }
}

/// A device callback may make a CPU and keep it: every CPU of the guest
/// thread is quiescent while the callback runs (softmm is inside the
/// access), and a CPU made then enters that state too, so that the state's
/// end leaves each CPU where it was. Before, the end left a level the new
/// CPU never entered (debug builds: the assertion that the depth was
/// positive; release builds: a depth wrapped to `u64::MAX`, a CPU no
/// shootdown would ever wait for). After the call the kept CPU reads,
/// and sees another thread's `munmap` of its page.
#[test]
fn a_device_callback_may_make_a_cpu_and_keep_it() {
    let (p, mm) = setup();
    let other = AddressSpace::new(&p, MmConfig::default()).unwrap();
    let at = other.mmap(0, PAGE, RW, ANON | MAP_POPULATE, None, 0).unwrap();
    let mut writer = Cpu::attached(&other);
    writer.write_u64(at, 77).unwrap();
    let io = mm.mmap_io(0, PAGE, RW, SHARED, Arc::new(ADmaEngine { other: other.clone(), at })).unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u64(io), Ok(77), "the device read the other address space");
    assert_eq!(cpu.read_u64(io), Ok(77), "and again through the CPU it kept");
    DMA_CPU.with(|c| assert_eq!(c.borrow_mut().as_mut().unwrap().read_u64(at), Ok(77)));
    let o = other.clone();
    std::thread::spawn(move || o.munmap(at, PAGE).unwrap()).join().unwrap();
    DMA_CPU.with(|c| {
        let r = c.borrow_mut().as_mut().unwrap().read_u64(at);
        assert!(matches!(r, Err(Fault::Segv { code: SegvCode::MapErr, .. })), "{r:?}");
    });
    DMA_CPU.with(|c| c.borrow_mut().take());
    drop((cpu, writer));
    mm.munmap(io, PAGE).unwrap();
    drop((mm, other));
    assert_no_leaks(&p);
}

/// A device callback that accesses memory through another CPU of its
/// thread is an access like any other: a shootdown of that memory by
/// another thread waits for it. Every CPU of the guest thread is quiescent
/// while softmm runs the callback; the access lifts that for its section.
/// Before, the other thread's `munmap` returned while the callback still
/// held its translation: the frame could be reused under it.
#[test]
fn a_shootdown_waits_for_a_device_callbacks_access_through_another_cpu() {
    // One thread, the guest's: the CPUs are registered with it.
    watchdog("callback-access", 60, || {
        let (p, mm) = setup();
        let other = AddressSpace::new(&p, MmConfig::default()).unwrap();
        let at = other.mmap(0, PAGE, RW, ANON | MAP_POPULATE, None, 0).unwrap();
        PROBE_CPU.with(|c| *c.borrow_mut() = Some(Cpu::attached(&other)));
        PROBE_CPU.with(|c| assert_eq!(c.borrow_mut().as_mut().unwrap().read_u64(at), Ok(0)));
        // The register answers 1 if another thread's munmap of the page
        // returned (and so could have freed the frame) while the callback
        // held a translation of it.
        let o = other.clone();
        let run = move || {
            PROBE_CPU.with(|c| {
                let mut c = c.borrow_mut();
                let held = c.as_mut().unwrap().translate(at, Access::Read).unwrap();
                let unmapped = Arc::new(AtomicBool::new(false));
                let unmapper = {
                    let (o, unmapped) = (o.clone(), unmapped.clone());
                    std::thread::spawn(move || {
                        o.munmap(at, PAGE).unwrap();
                        unmapped.store(true, Ordering::SeqCst);
                    })
                };
                // Long enough for an unmap that does not wait to return.
                std::thread::sleep(std::time::Duration::from_millis(300));
                let early = unmapped.load(Ordering::SeqCst);
                drop(held);
                unmapper.join().unwrap();
                u64::from(early)
            })
        };
        let io = mm.mmap_io(0, PAGE, RW, SHARED, Arc::new(AProbe(Box::new(run)))).unwrap();
        let mut cpu = Cpu::attached(&mm);
        assert_eq!(cpu.read_u64(io), Ok(0), "the munmap returned while the callback held a translation of its page");
        PROBE_CPU.with(|c| {
            let r = c.borrow_mut().as_mut().unwrap().read_u64(at);
            assert!(matches!(r, Err(Fault::Segv { code: SegvCode::MapErr, .. })), "{r:?}");
        });
        PROBE_CPU.with(|c| c.borrow_mut().take());
        drop(cpu);
        mm.munmap(io, PAGE).unwrap();
        drop((mm, other));
        assert_no_leaks(&p);
    });
}

thread_local! {
    /// The CPU of [`AProbe`]'s callbacks, made by the test on the guest thread.
    static PROBE_CPU: std::cell::RefCell<Option<Cpu>> = const { std::cell::RefCell::new(None) };
}

/// A device whose register read runs a closure of the test.
struct AProbe(Box<dyn Fn() -> u64 + Send + Sync>);

impl MmioDevice for AProbe {
    fn read(&self, _offset: u64, _size: usize) -> u64 {
        (self.0)()
    }

    fn write(&self, _offset: u64, _size: usize, _value: u64) {}

    fn name(&self) -> &str {
        "/dev/probe"
    }
}

/// Under `ShootdownPolicy::NextAccess` (a shootdown waits for a CPU
/// outside an access until its next one), a device callback that accessed
/// memory through a CPU of its thread and then blocks on another thread's
/// shootdown of that CPU's address space does not hold it up: the access's
/// section gave back the quiescence it lifted when it ended (after a plain
/// access, or after a translation forgotten inside and the CPU moved to
/// another address space and back). Before, the CPU stayed lifted until
/// the call ended, and the two threads waited for each other.
#[test]
fn a_callback_that_blocks_after_its_access_holds_no_shootdown_up() {
    watchdog("blocking-after-access", 30, || {
        for forget in [false, true] {
            let (p, mm) = setup();
            let config = MmConfig::default()
                .shootdown_policy(softmm::ShootdownPolicy::NextAccess)
                .shootdown_targets(softmm::ShootdownTargets::Broadcast);
            let other = AddressSpace::new(&p, config).unwrap();
            let elsewhere = AddressSpace::new(&p, MmConfig::default()).unwrap();
            let at = other.mmap(0, 2 * PAGE, RW, ANON | MAP_POPULATE, None, 0).unwrap();
            PROBE_CPU.with(|c| *c.borrow_mut() = Some(Cpu::attached(&other)));
            let (o, e) = (other.clone(), elsewhere.clone());
            let run = move || {
                PROBE_CPU.with(|c| {
                    let mut c = c.borrow_mut();
                    let cpu = c.as_mut().unwrap();
                    if forget {
                        std::mem::forget(cpu.translate(at, Access::Read).unwrap());
                        cpu.attach(&e);
                        cpu.attach(&o);
                    } else {
                        cpu.read_u64(at).unwrap();
                    }
                });
                let o = o.clone();
                std::thread::spawn(move || o.munmap(at + PAGE, PAGE).unwrap()).join().unwrap();
                7
            };
            let io = mm.mmap_io(0, PAGE, RW, SHARED, Arc::new(AProbe(Box::new(run)))).unwrap();
            let mut cpu = Cpu::attached(&mm);
            assert_eq!(cpu.read_u64(io), Ok(7), "forget: {forget}");
            PROBE_CPU.with(|c| c.borrow_mut().take());
            drop(cpu);
            mm.munmap(io, PAGE).unwrap();
            drop((mm, other, elsewhere));
            assert_no_leaks(&p);
        }
    });
}
