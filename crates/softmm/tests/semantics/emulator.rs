//! An emulator-style use of the embedding API: a loader maps text and data,
//! an interpreter fetches and executes toy instructions through a `Cpu`
//! with the typed accessors, faults become guest signals, two guest threads
//! share a counter through atomics, and a forked guest runs on its own
//! copy; a loader maps a program from a host file and a debugger plants a
//! breakpoint in its read-only text with a forced write; and everything an
//! emulator layers on its TLB at once (a device register, a watchpoint, an
//! atomic across a page boundary) in guest threads beside munmap and fork.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use softmm::uapi::*;
use softmm::{
    AddressSpace, AtomicAlignment, Cpu, Fault, MmConfig, MmioDevice, PhysConfig, PhysMem, SegvCode, WatchAccess,
};

const PAGE: u64 = 4096;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

/// The toy ISA: `op | rd << 8 | rs << 12 | imm16 << 16`, little-endian.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Op {
    Halt,
    Li,
    Ld16,
    St16,
    AtomicAdd,
    AddI,
    Bnz,
}

const fn insn(op: Op, rd: u32, rs: u32, imm: i16) -> u32 {
    op as u32 | rd << 8 | rs << 12 | (imm as u16 as u32) << 16
}

struct Vcpu {
    cpu: Cpu,
    r: [u64; 16],
    pc: u64,
}

impl Vcpu {
    /// Runs until `Halt` (`Ok`) or a fault, with `pc` at the faulting
    /// instruction. Each basic block (up to a branch, at most 16
    /// instructions) runs in one access section, as an emulator would:
    /// its fetches and accesses pay the TLB lookup only, and no shootdown
    /// waits longer than one block.
    fn run(&mut self) -> Result<(), Fault> {
        loop {
            let mut s = self.cpu.section();
            for _ in 0..16 {
                let w = s.fetch_u32(self.pc)?;
                let (op, rd, rs, imm) =
                    (w & 0xff, (w >> 8 & 15) as usize, (w >> 12 & 15) as usize, (w >> 16) as i16 as i64);
                match op {
                    0 => return Ok(()),
                    1 => self.r[rd] = imm as u64,
                    2 => self.r[rd] = s.read_le::<u16>(self.r[rs])?.into(),
                    3 => s.write_le::<u16>(self.r[rd], self.r[rs] as u16)?,
                    4 => drop(s.atomic_fetch_add::<u64>(self.r[rd], self.r[rs], Ordering::AcqRel)?),
                    5 => self.r[rd] = self.r[rd].wrapping_add(imm as u64),
                    6 => {
                        if self.r[rd] != 0 {
                            self.pc = self.pc.wrapping_add((imm * 4 - 4) as u64);
                        }
                        self.pc += 4;
                        // End of the block.
                        break;
                    }
                    _ => panic!("illegal instruction {w:#x}"),
                }
                self.pc += 4;
            }
        }
    }
}

/// `r1` = the counter's address; adds 1 to it `r2` times, atomically.
const COUNT: [u32; 5] = [
    insn(Op::Li, 3, 0, 1),
    insn(Op::AtomicAdd, 1, 3, 0), // loop: [r1] += r3
    insn(Op::AddI, 2, 0, -1),
    insn(Op::Bnz, 2, 0, -2),
    insn(Op::Halt, 0, 0, 0),
];

/// Maps `program` as a loader does (written, then read+exec) and a data
/// page; returns (text, data).
fn load(mm: &Arc<AddressSpace>, program: &[u32]) -> (u64, u64) {
    let text = mm.mmap(0, PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
    let data = mm.mmap(0, PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(mm);
    cpu.write(text, softmm::bytemuck::cast_slice(program)).unwrap();
    mm.mprotect(text, PAGE, PROT_READ | PROT_EXEC).unwrap();
    (text, data)
}

#[track_caller]
fn assert_no_leaks(phys: &PhysMem) {
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0), "{s:?}");
}

/// Two guest threads, each a host thread with its own CPU, count to N on
/// a shared counter; then a store into the text and a jump into the data
/// raise the signals Linux would.
#[test]
fn guest_threads_share_memory_and_faults_become_signals() {
    const N: u64 = 5_000;
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let (text, data) = load(&mm, &COUNT);
    std::thread::scope(|s| {
        for _ in 0..2 {
            let mm = &mm;
            s.spawn(move || {
                let mut v = Vcpu { cpu: Cpu::attached(mm), r: [0; 16], pc: text };
                v.r[1] = data;
                v.r[2] = N;
                v.run().unwrap();
            });
        }
    });
    let mut v = Vcpu { cpu: Cpu::attached(&mm), r: [0; 16], pc: text };
    assert_eq!(v.cpu.read_u64(data).unwrap(), 2 * N);

    // Self-modifying code needs PROT_WRITE on the text, as on Linux.
    let store = [
        insn(Op::Li, 2, 0, 0x1234),
        insn(Op::St16, 1, 2, 0), // [r1] = r2, into the text page
        insn(Op::Ld16, 4, 1, 0), // r4 = [r1]
        insn(Op::Halt, 0, 0, 0),
    ];
    let (text2, _) = load(&mm, &store);
    v.pc = text2;
    v.r[1] = text2 + 16;
    assert_eq!(v.run(), Err(Fault::Segv { addr: text2 + 16, code: SegvCode::AccErr }));
    assert_eq!(v.pc, text2 + 4);
    mm.mprotect(text2, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC).unwrap();
    v.run().unwrap();
    assert_eq!(v.r[4], 0x1234);
    // The new instruction word is what a fetch sees.
    assert_eq!(v.cpu.fetch_u32(text2 + 16).unwrap(), 0x1234);
    // A jump into data: the fetch faults at the target.
    v.pc = data;
    assert_eq!(v.run(), Err(Fault::Segv { addr: data, code: SegvCode::AccErr }));
    drop((v, mm));
    assert_no_leaks(&phys);
}

/// A forked guest runs the same text on its own copy of the data, and a
/// change of protection in the child leaves the parent's alone.
#[test]
fn a_forked_guest_runs_on_its_own_copy() {
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let (text, data) = load(&mm, &COUNT);
    let mut parent = Vcpu { cpu: Cpu::attached(&mm), r: [0; 16], pc: text };
    parent.cpu.write_le::<u64>(data, 100).unwrap();
    let child_mm = mm.fork().unwrap();
    let mut child = Vcpu { cpu: Cpu::attached(&child_mm), r: [0; 16], pc: text };
    child.r[1] = data;
    child.r[2] = 5;
    child.run().unwrap();
    assert_eq!(child.cpu.read_u64(data).unwrap(), 105);
    assert_eq!(parent.cpu.read_u64(data).unwrap(), 100);
    child_mm.mprotect(text, PAGE, PROT_READ).unwrap();
    child.pc = text;
    assert_eq!(child.run(), Err(Fault::Segv { addr: text, code: SegvCode::AccErr }));
    parent.r[1] = data;
    parent.r[2] = 1;
    parent.run().unwrap();
    assert_eq!(parent.cpu.read_u64(data).unwrap(), 101);
    drop((parent, child, mm, child_mm));
    assert_no_leaks(&phys);
}

/// A loader maps a program image from a host file (text read-only and
/// executable, data private and writable, both from the file); a debugger
/// plants a breakpoint in the text with a forced write (`FOLL_FORCE`, as
/// `PTRACE_POKEDATA`), the guest stops there, the debugger restores the
/// instruction, and the guest finishes. The host file never changes, and a
/// guest forked at the breakpoint keeps its own copy of the text.
#[test]
fn a_debugger_plants_a_breakpoint_in_text_mapped_from_a_host_file() {
    use softmm::{OpenFile, PAGE_SIZE};
    // The image: page 0 the text (COUNT), page 1 the data (a counter of 7).
    let mut image = vec![0u8; 2 * PAGE_SIZE as usize];
    image[..COUNT.len() * 4].copy_from_slice(softmm::bytemuck::cast_slice(&COUNT));
    image[PAGE_SIZE as usize..][..8].copy_from_slice(&7u64.to_le_bytes());
    let path = std::env::temp_dir().join(format!("softmm-emulator-{}", std::process::id()));
    std::fs::write(&path, &image).unwrap();

    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let exe = OpenFile::from_host(&phys, std::fs::File::open(&path).unwrap(), "toy.elf").unwrap();
    let text = mm.mmap(0, PAGE, PROT_READ | PROT_EXEC, MAP_PRIVATE, Some(&exe), 0).unwrap();
    let data = mm.mmap(0, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, Some(&exe), PAGE).unwrap();
    drop(exe);

    // The breakpoint: `Halt` over the loop's `AddI`, written by force.
    let at = text + 8;
    let mut saved = [0u8; 4];
    assert_eq!(mm.access_remote_read(at, &mut saved, true), 4);
    let halt = insn(Op::Halt, 0, 0, 0).to_le_bytes();
    assert_eq!(mm.access_remote_write(at, &halt, false), 0, "text is read-only without FOLL_FORCE");
    assert_eq!(mm.access_remote_write(at, &halt, true), 4);

    let mut v = Vcpu { cpu: Cpu::attached(&mm), r: [0; 16], pc: text };
    v.r[1] = data;
    v.r[2] = 3;
    v.run().unwrap();
    assert_eq!(v.pc, at, "stopped at the breakpoint");
    assert_eq!(v.cpu.read_le::<u64>(data).unwrap(), 8, "one pass of the loop");
    // The guest still cannot write its text.
    assert_eq!(v.cpu.write_u8(at, 0), Err(Fault::Segv { addr: at, code: SegvCode::AccErr }));

    // Fork at the breakpoint; the child keeps the breakpoint, the parent's
    // debugger restores the instruction and lets the parent finish.
    let child_mm = mm.fork().unwrap();
    assert_eq!(mm.access_remote_write(at, &saved, true), 4);
    v.run().unwrap();
    assert_eq!(v.cpu.read_le::<u64>(data).unwrap(), 10);
    let mut c = Vcpu { cpu: Cpu::attached(&child_mm), r: v.r, pc: text };
    c.r[2] = 3;
    c.run().unwrap();
    assert_eq!(c.pc, at, "the child's text still has the breakpoint");
    assert_eq!(c.cpu.read_le::<u64>(data).unwrap(), 9, "the child's own data: 8 at the fork, one pass");

    drop((v, c, mm, child_mm));
    assert_no_leaks(&phys);
    assert!(std::fs::read(&path).unwrap() == image, "the host file is untouched");
    std::fs::remove_file(&path).unwrap();
}

/// A device register that counts the stores it serves and keeps the last.
#[derive(Default)]
struct Port {
    stores: std::sync::atomic::AtomicU64,
    last: std::sync::atomic::AtomicU64,
}

impl MmioDevice for Port {
    fn read(&self, _offset: u64, _size: usize) -> u64 {
        self.last.load(Ordering::Relaxed)
    }

    fn write(&self, _offset: u64, _size: usize, value: u64) {
        self.stores.fetch_add(1, Ordering::Relaxed);
        self.last.store(value, Ordering::Relaxed);
    }

    fn name(&self) -> &str {
        "/dev/port"
    }
}

/// `r1` = a counter that straddles two pages, `r2` = N, `r4` = a device
/// register, `r6` = a watched word: N times, adds 1 to the counter (a
/// split atomic) and stores the count left to the device; then stores to
/// the watched word.
const COUNT_TO_PORT: [u32; 7] = [
    insn(Op::Li, 3, 0, 1),
    insn(Op::AtomicAdd, 1, 3, 0), // loop: [r1] += r3
    insn(Op::St16, 4, 2, 0),      // [r4] = r2: the device
    insn(Op::AddI, 2, 0, -1),
    insn(Op::Bnz, 2, 0, -3),
    insn(Op::St16, 6, 3, 0), // [r6] = r3: the watchpoint
    insn(Op::Halt, 0, 0, 0),
];

/// Two guest threads run `COUNT_TO_PORT` under `AtomicAlignment::Split`
/// while a third maps and unmaps and forks the address space: every split
/// atomic counts (the fork's COW protection of the counter's pages races
/// them), the device serves every store and outlives no munmap, and each
/// thread's watchpoint fires once and is passed.
#[test]
fn a_device_a_watchpoint_and_split_atomics_in_guest_threads_beside_munmap_and_fork() {
    const N: u64 = 2000;
    let phys = PhysMem::new(PhysConfig::new(4 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default().atomic_alignment(AtomicAlignment::Split)).unwrap();
    let (text, _) = load(&mm, &COUNT_TO_PORT);
    let data = mm.mmap(0, 3 * PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
    // The counter straddles the first two pages.
    let (counter, watched) = (data + PAGE - 4, data + 2 * PAGE + 64);
    let port = Arc::new(Port::default());
    let io = mm.mmap_io(0, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, port.clone()).unwrap();
    mm.watchpoint_insert(watched, 2, WatchAccess::WRITE).unwrap();
    let (done, forked) = (std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicBool::new(false));
    let forks = std::thread::scope(|s| {
        let guests: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    // The guests start beside the forker's first fork.
                    while !forked.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                    let mut v = Vcpu { cpu: Cpu::attached(&mm), r: [0; 16], pc: text };
                    (v.r[1], v.r[2], v.r[4], v.r[6]) = (counter, N, io, watched);
                    let mut watchpoints = Vec::new();
                    let r = loop {
                        match v.run() {
                            Err(Fault::Watchpoint { addr }) => {
                                watchpoints.push((addr, v.pc));
                                v.cpu.pass_watchpoint();
                            }
                            r => break r,
                        }
                    };
                    done.fetch_add(1, Ordering::Release);
                    (r, watchpoints)
                })
            })
            .collect();
        let forker = s.spawn(|| {
            let mut forks = 0;
            while done.load(Ordering::Acquire) < 2 {
                let a = mm.mmap(0, 16 * PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
                Cpu::attached(&mm).write_u64(a, 1).unwrap();
                mm.munmap(a, 16 * PAGE).unwrap();
                drop(mm.fork().unwrap());
                forked.store(true, Ordering::Release);
                forks += 1;
            }
            forks
        });
        for g in guests {
            let (r, watchpoints) = g.join().unwrap();
            assert_eq!(r, Ok(()));
            assert_eq!(watchpoints, [(watched, text + 5 * 4)], "one watchpoint, at the store");
        }
        forker.join().unwrap()
    });
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u64(counter).unwrap(), 2 * N, "every split atomic counted ({forks} forks beside)");
    assert_eq!(port.stores.load(Ordering::Relaxed), 2 * N);
    assert_eq!(cpu.read_u16(watched).unwrap(), 1, "the passed store was made");
    drop(cpu);
    mm.munmap(io, PAGE).unwrap();
    assert_eq!(Arc::strong_count(&port), 1, "the device is released with its mapping");
    drop(mm);
    assert_no_leaks(&phys);
}
