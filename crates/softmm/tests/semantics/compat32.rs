//! `MmConfig::compat32`, against the host kernel's layout for a 32-bit
//! task: a static i386 program (raw `int 0x80` system calls, no libc), run
//! without address randomization, maps one page and then 2 MiB and prints
//! its maps. softmm under `compat32` maps a block where the host put the
//! vDSO (its size, no address: it lands at `mmap_base`, as the vDSO does),
//! then the same two mappings, which must land where the host put them:
//! the top-down search starts at the same `mmap_base`, and the 2 MiB
//! mapping is not aligned to 2 MiB (a 32-bit task gets no THP alignment).
//!
//! The host needs a compiler that emits i386 code (`cc -m32`, no 32-bit
//! libc needed) and a kernel with ia32 emulation; without them the test
//! says so and passes.

use softmm::uapi::*;
use softmm::*;
use std::process::Command;

const PROGRAM: &str = r#"
static long sys6(long n, long a, long b, long c, long d, long e, long f) {
    long r;
    __asm__ volatile("push %%ebp\n mov %7, %%ebp\n int $0x80\n pop %%ebp"
                     : "=a"(r) : "a"(n), "b"(a), "c"(b), "d"(c), "S"(d), "D"(e), "g"(f) : "memory");
    return r;
}
static char buf[16384];
void _start(void) {
    sys6(192, 0, 4096, 3, 0x22, -1, 0);     /* mmap2: one page */
    sys6(192, 0, 2 << 20, 3, 0x22, -1, 0);  /* mmap2: 2 MiB */
    long fd = sys6(5, (long)"/proc/self/maps", 0, 0, 0, 0, 0);
    long n = sys6(3, fd, (long)buf, sizeof buf, 0, 0, 0);
    sys6(4, 1, (long)buf, n, 0, 0, 0);
    sys6(1, 0, 0, 0, 0, 0, 0);
}
"#;

/// The host's maps of the program, as `(start, end, name)`, or why the host
/// cannot run it.
fn host_maps() -> std::result::Result<Vec<(u64, u64, String)>, String> {
    let dir = std::env::temp_dir().join(format!("softmm-compat32-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (src, exe) = (dir.join("m32.c"), dir.join("m32"));
    std::fs::write(&src, PROGRAM).map_err(|e| e.to_string())?;
    let cc = Command::new("cc")
        .args(["-m32", "-O1", "-nostdlib", "-static", "-fno-pie", "-no-pie", "-fno-stack-protector", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| format!("no C compiler: {e}"))?;
    if !cc.status.success() {
        return Err(format!("cc -m32 failed: {}", String::from_utf8_lossy(&cc.stderr)));
    }
    let run = Command::new("setarch").arg("-R").arg(&exe).output().map_err(|e| format!("setarch: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    if !run.status.success() {
        return Err(format!("the i386 program did not run (no ia32 emulation?): {:?}", run.status));
    }
    Ok(String::from_utf8_lossy(&run.stdout)
        .lines()
        .filter_map(|l| {
            let (range, rest) = l.split_once(' ')?;
            let (a, b) = range.split_once('-')?;
            let name = rest.split_whitespace().nth(4).unwrap_or("").to_string();
            Some((u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b, 16).ok()?, name))
        })
        .collect())
}

#[test]
fn compat32_places_mappings_where_a_32_bit_linux_task_gets_them() {
    let host = match host_maps() {
        Ok(m) => m,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    // Everything the kernel placed top-down below the stack: the program's
    // two anonymous mappings, then vvar/vdso at the top.
    let top: Vec<_> = host.iter().filter(|(s, _, n)| *s > 0x1000_0000 && n != "[stack]").collect();
    let vdso_start = top.iter().filter(|(_, _, n)| n.starts_with("[v")).map(|m| m.0).min().expect("a vDSO");
    let vdso_end = top.iter().filter(|(_, _, n)| n.starts_with("[v")).map(|m| m.1).max().unwrap();
    let anon: Vec<_> = top.iter().filter(|(_, _, n)| n.is_empty()).collect();
    // The two anonymous mappings, merged into one VMA when they abut.
    let (lo, hi) = (anon.iter().map(|m| m.0).min().unwrap(), anon.iter().map(|m| m.1).max().unwrap());

    let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::compat32()).unwrap();
    let rw = PROT_READ | PROT_WRITE;
    let anon_flags = MAP_PRIVATE | MAP_ANONYMOUS;
    let vdso = mm.mmap(0, vdso_end - vdso_start, PROT_READ, anon_flags, None, 0).unwrap();
    assert_eq!((vdso, vdso + (vdso_end - vdso_start)), (vdso_start, vdso_end), "mmap_base differs from the host's");
    let page = mm.mmap(0, PAGE_SIZE, rw, anon_flags, None, 0).unwrap();
    let big = mm.mmap(0, 2 << 20, rw, anon_flags, None, 0).unwrap();
    assert_eq!(page, vdso_start - PAGE_SIZE);
    assert_eq!((big, page + PAGE_SIZE), (lo, hi), "the host placed [{lo:#x}, {hi:#x})");
}

#[test]
fn compat32_keeps_every_mapping_below_the_32_bit_limit() {
    let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
    let config = MmConfig::compat32();
    assert_eq!(config.check(), Ok(()));
    let mm = AddressSpace::new(&phys, config).unwrap();
    let flags = MAP_PRIVATE | MAP_ANONYMOUS;
    // Above the limit, or past it: ENOMEM, as for any task's TASK_SIZE.
    assert_eq!(mm.mmap(TASK_SIZE_32, PAGE_SIZE, PROT_READ, flags | MAP_FIXED, None, 0), Err(Errno::NoMem));
    assert_eq!(mm.mmap(0, TASK_SIZE_32, PROT_READ, flags, None, 0), Err(Errno::NoMem));
    // A hint above the limit is ignored: the search starts at mmap_base.
    let a = mm.mmap(1 << 40, PAGE_SIZE, PROT_READ, flags, None, 0).unwrap();
    assert_eq!(a, TASK_SIZE_32 - (128 << 20) - PAGE_SIZE);
    // The last page below the limit can be mapped at a fixed address.
    assert_eq!(
        mm.mmap(TASK_SIZE_32 - PAGE_SIZE, PAGE_SIZE, PROT_READ, flags | MAP_FIXED, None, 0),
        Ok(TASK_SIZE_32 - PAGE_SIZE)
    );
    // Filling the space ends in ENOMEM, never in an address above the limit.
    let mut n = 0;
    while let Ok(b) = mm.mmap(0, 64 << 20, PROT_NONE, flags | MAP_NORESERVE, None, 0) {
        assert!(b + (64 << 20) <= TASK_SIZE_32);
        n += 1;
        assert!(n < 64, "more than 4 GiB mapped");
    }
    assert!(n >= 60, "only {n} blocks of 64 MiB fit");
}

#[test]
fn a_configuration_linux_could_not_have_names_its_field() {
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let d = MmConfig::default;
    let cases: [(MmConfig, ConfigError); 9] = [
        (d().task_size(0), ConfigError::TaskSize),
        (d().task_size(TASK_SIZE + PAGE_SIZE), ConfigError::TaskSize),
        // A 32-bit task size with the 64-bit layout: mmap_base is above it.
        (d().task_size(TASK_SIZE_32), ConfigError::MmapBase),
        (d().mmap_min_addr(100), ConfigError::MmapMinAddr),
        (d().lsm_mmap_min_addr(100), ConfigError::LsmMmapMinAddr),
        (MmConfig::compat32().start_brk(TASK_SIZE_32 + PAGE_SIZE), ConfigError::StartBrk),
        (d().stack_guard_gap(TASK_SIZE), ConfigError::StackGuardGap),
        (d().max_map_count(0), ConfigError::MaxMapCount),
        (d().fault_around_pages(513), ConfigError::FaultAroundPages),
    ];
    for (config, want) in cases {
        assert_eq!(config.check(), Err(want), "{config:?}");
        assert!(!want.to_string().is_empty());
        assert_eq!(AddressSpace::new(&phys, config).err(), Some(Errno::Inval));
    }
}
