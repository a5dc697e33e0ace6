/*
 * The C API's contracts: -errno results with Linux's errno (and nothing
 * changed by a failed call), guest faults as {signo, code, addr}, NULL
 * handles, thread affinity of CPUs, atomics, the maps buffer, and no leak.
 * Also configuration (arena and address-space configs, policies by name,
 * memory on demand), forced access, msync and host-backed files; access
 * sections. The structured regions, statistics, pins, NUMA policy,
 * hugetlbfs files and overcommit settings, with their size-versioned
 * structs. The atomic-alignment policy.
 * Run by tests/c.rs; prints "N passed, M failed" and exits non-zero on a
 * failure.
 */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MAP_GROWSDOWN, MREMAP_MAYMOVE under -std=c11 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <linux/falloc.h>

#include "softmm.h"

/* <numaif.h>'s values, without libnuma. */
#define MPOL_BIND 2
#define MPOL_MF_MOVE (1 << 1)
#define MPOL_F_NODE (1 << 0)
#define MPOL_F_ADDR (1 << 1)

static int passed, failed;

#define EXPECT(cond)                                                   \
    do {                                                               \
        if (cond) {                                                    \
            passed++;                                                  \
        } else {                                                       \
            failed++;                                                  \
            fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond); \
        }                                                              \
    } while (0)

#define EXPECT_FAULT(call, sig, si_code, address)                                          \
    do {                                                                                   \
        softmm_fault f_ = {0};                                                             \
        int rc_ = (call);                                                                  \
        EXPECT(rc_ == SOFTMM_FAULTED && f_.signo == (sig) && f_.code == (si_code) &&       \
               f_.addr == (uint64_t)(address));                                            \
        if (rc_ != SOFTMM_FAULTED || f_.addr != (uint64_t)(address))                       \
            fprintf(stderr, "  rc %d signo %d code %d addr %#llx\n", rc_, f_.signo, f_.code, \
                    (unsigned long long)f_.addr);                                          \
    } while (0)

#define ANON (MAP_PRIVATE | MAP_ANONYMOUS)
#define RW (PROT_READ | PROT_WRITE)
#define PAGE 4096ULL

struct other_thread {
    softmm_cpu *cpu;
    int read_rc, free_rc;
};

static void *use_from_another_thread(void *arg) {
    struct other_thread *t = arg;
    uint64_t v;
    t->read_rc = softmm_cpu_read_uint(t->cpu, 0x10000, 8, &v, NULL);
    t->free_rc = softmm_cpu_free(t->cpu);
    return NULL;
}

static char maps_before[8192], maps_after[8192];

/* Configuration, forced access, msync and host-backed files. */
static void embedder_contracts(void) {
    softmm_phys_config pc;
    EXPECT(softmm_phys_config_default(&pc) == 0 && pc.size == sizeof pc && pc.nodes == 1);
    softmm_phys *phys = NULL;
    pc.bytes = 64 << 20;
    pc.on_demand = 1;
    pc.nodes = 0;
    EXPECT(softmm_phys_new_config(&pc, &phys) == -EINVAL && phys == NULL);
    pc.nodes = 1;
    pc.size = 8;
    EXPECT(softmm_phys_new_config(&pc, &phys) == -EINVAL && phys == NULL);
    pc.size = sizeof pc;
    EXPECT(softmm_phys_new_config(NULL, &phys) == -EINVAL);
    EXPECT(softmm_phys_new_config(&pc, &phys) == 0 && phys != NULL);

    softmm_mm_config mc;
    EXPECT(softmm_mm_config_default(&mc) == 0 && mc.size == sizeof mc && mc.fault_policy == NULL);
    softmm_mm *mm = NULL;
    mc.fault_policy = "no-such-policy";
    EXPECT(softmm_mm_new_config(phys, &mc, &mm) == -EINVAL && mm == NULL);
    mc.fault_policy = "mmap-lock";
    mc.unmap_policy = "lock-free";
    mc.pin_policy = "batched";
    mc.writer_policy = "no-such-policy";
    EXPECT(softmm_mm_new_config(phys, &mc, &mm) == -EINVAL && mm == NULL);
    /* The scaling policies of 0.2.0, the designs before them. */
    mc.shootdown_targets = "broadcast";
    mc.posting_policy = "locked";
    mc.madvise_policy = "mmap-lock";
    mc.writer_policy = "reserve";
    mc.placement_policy = "linux";
    /* A size no version had is refused, not read in part: 100 cuts
     * `migrate_policy`, a pointer whose low half would be followed. An
     * older version's size reads its fields only, whatever lies past it. */
    softmm_mm_config cut = mc;
    cut.migrate_policy = "batched";
    cut.size = 100;
    EXPECT(softmm_mm_new_config(phys, &cut, &mm) == -EINVAL && mm == NULL);
    EXPECT(softmm_mm_config_check(&cut) != NULL);
    cut.size = 144;
    cut.shootdown_targets = (const char *)(uintptr_t)1; /* past 0.1.1's fields */
    EXPECT(softmm_mm_new_config(phys, &cut, &mm) == 0 && mm != NULL);
    softmm_mm_free(mm);
    mm = NULL;
    softmm_phys_config pcut = pc;
    pcut.size = 28;
    softmm_phys *p2 = NULL;
    EXPECT(softmm_phys_new_config(&pcut, &p2) == -EINVAL && p2 == NULL);
    EXPECT(softmm_mm_new_config(phys, &mc, &mm) == 0 && mm != NULL);
    softmm_cpu *cpu = NULL;
    EXPECT(softmm_cpu_new(mm, &cpu) == 0);

    /* Forced access: a breakpoint in read-only private text. */
    int64_t text = softmm_mmap(mm, 0, PAGE, PROT_READ | PROT_EXEC, ANON, NULL, 0);
    EXPECT(text > 0);
    uint8_t bp = 0xcc, b = 0;
    EXPECT(softmm_access_remote_write(mm, text, &bp, 1, 0) == 0);
    EXPECT(softmm_access_remote_write(mm, text, &bp, 1, 1) == 1);
    uint64_t v = 0;
    EXPECT(softmm_cpu_read_uint(cpu, text, 1, &v, NULL) == 0 && v == 0xcc);
    EXPECT_FAULT(softmm_cpu_write_uint(cpu, text, 1, 0, &f_), SIGSEGV, 2, text);
    EXPECT(softmm_access_remote_read(mm, text, &b, 1, 0) == 1 && b == 0xcc);
    EXPECT(softmm_access_remote_write(NULL, text, &bp, 1, 1) == -EINVAL);
    EXPECT(softmm_access_remote_write(mm, text, NULL, 1, 1) == -EFAULT);
    /* Shared read-only: never written, forced or not. */
    int64_t shared = softmm_mmap(mm, 0, PAGE, PROT_READ, MAP_SHARED | MAP_ANONYMOUS, NULL, 0);
    EXPECT(shared > 0);
    EXPECT(softmm_access_remote_write(mm, shared, &bp, 1, 1) == 0);
    /* PROT_NONE reads only with force; a range stops at the hole. */
    int64_t none = softmm_mmap(mm, 0, 2 * PAGE, PROT_NONE, ANON, NULL, 0);
    EXPECT(none > 0 && softmm_munmap(mm, none + PAGE, PAGE) == 0);
    char buf[16];
    EXPECT(softmm_access_remote_read(mm, none, buf, 4, 0) == 0);
    EXPECT(softmm_access_remote_read(mm, none + PAGE - 4, buf, 16, 1) == 4);

    /* msync's errnos. */
    EXPECT(softmm_msync(mm, text + 1, PAGE, MS_SYNC) == -EINVAL);
    EXPECT(softmm_msync(mm, text, PAGE, MS_SYNC | MS_ASYNC) == -EINVAL);
    EXPECT(softmm_msync(mm, none, 2 * PAGE, MS_SYNC) == -ENOMEM);
    EXPECT(softmm_msync(mm, text, PAGE, MS_SYNC) == 0);

    /* A host file, read-write: shared writes reach it on msync. */
    char path[] = "/tmp/softmm-contracts-XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0);
    EXPECT(write(fd, "hello, host", 11) == 11);
    softmm_file *hf = NULL;
    EXPECT(softmm_file_open_host(phys, -1, "x", &hf) == -EBADF && hf == NULL);
    int dir = open("/tmp", O_RDONLY | O_DIRECTORY);
    EXPECT(softmm_file_open_host(phys, dir, "x", &hf) == -ENODEV && hf == NULL);
    close(dir);
    EXPECT(softmm_file_open_host(phys, fd, "data", &hf) == 0 && hf != NULL);
    int64_t m = softmm_mmap(mm, 0, PAGE, RW, MAP_SHARED, hf, 0);
    EXPECT(m > 0);
    EXPECT(softmm_cpu_read_uint(cpu, m, 1, &v, NULL) == 0 && v == 'h');
    EXPECT(softmm_cpu_write_uint(cpu, m, 1, 'J', NULL) == 0);
    EXPECT(softmm_msync(mm, m, PAGE, MS_SYNC) == 0);
    char back[12] = {0};
    EXPECT(pread(fd, back, 11, 0) == 11 && memcmp(back, "Jello, host", 11) == 0);
    EXPECT(softmm_cpu_write_uint(cpu, m + 1, 1, 'E', NULL) == 0);
    EXPECT(softmm_file_sync(hf) == 0);
    EXPECT(pread(fd, back, 11, 0) == 11 && memcmp(back, "JEllo, host", 11) == 0);
    /* Past the host file's end: SIGBUS, as Linux. */
    int64_t m2 = softmm_mmap(mm, 0, 2 * PAGE, PROT_READ, MAP_SHARED, hf, 0);
    EXPECT(m2 > 0);
    EXPECT_FAULT(softmm_cpu_read_uint(cpu, m2 + PAGE, 1, &v, &f_), SIGBUS, BUS_ADRERR, m2 + PAGE);
    /* Read-only host descriptor: no shared writable mapping. */
    int rofd = open(path, O_RDONLY);
    softmm_file *ro = NULL;
    EXPECT(softmm_file_open_host(phys, rofd, "ro", &ro) == 0);
    close(rofd); /* softmm keeps its own duplicate */
    EXPECT(softmm_mmap(mm, 0, PAGE, RW, MAP_SHARED, ro, 0) == -EACCES);
    int64_t rm = softmm_mmap(mm, 0, PAGE, PROT_READ, MAP_PRIVATE, ro, 0);
    EXPECT(rm > 0 && softmm_cpu_read_uint(cpu, rm + 2, 1, &v, NULL) == 0 && v == 'l');

    softmm_file_free(ro);
    softmm_file_free(hf);
    EXPECT(softmm_cpu_free(cpu) == 0);
    softmm_mm_free(mm);
    softmm_phys_stats s = {1, 1, 1, 1};
    EXPECT(softmm_phys_get_stats(phys, &s) == 0);
    EXPECT(s.frames_used == 0 && s.page_tables == 0 && s.vmas == 0 && s.rmap_entries == 0);
    softmm_phys_free(phys);
    close(fd);
    unlink(path);
}

struct other_section {
    softmm_section *s;
    int read_rc, end_rc;
};

static void *use_section_from_another_thread(void *arg) {
    struct other_section *t = arg;
    uint64_t v;
    t->read_rc = softmm_section_read_uint(t->s, 0x10000, 8, &v, NULL);
    t->end_rc = softmm_section_end(t->s);
    return NULL;
}

/* Sections: the accessors' faults and errno, one section per CPU, the
 * CPU's own calls refused while one is open, thread affinity, an unmap
 * from inside the section seen by its next access, and no leak. */
static void section_contracts(void) {
    softmm_phys *phys;
    softmm_mm *mm;
    softmm_cpu *cpu;
    softmm_section *s = NULL, *s2 = NULL;
    EXPECT(softmm_phys_new(4 << 20, &phys) == 0);
    EXPECT(softmm_mm_new(phys, &mm) == 0);
    EXPECT(softmm_cpu_new(mm, &cpu) == 0);
    long long a = softmm_mmap(mm, 0, 4 * PAGE, RW, ANON, NULL, 0);
    EXPECT(a > 0);
    uint64_t base = (uint64_t)a, v = 0;
    EXPECT(softmm_munmap(mm, base + 3 * PAGE, PAGE) == 0);
    EXPECT(softmm_mprotect(mm, base + PAGE, PAGE, PROT_READ) == 0);

    EXPECT(softmm_cpu_section_begin(NULL, &s) == -EINVAL);
    EXPECT(softmm_cpu_section_begin(cpu, NULL) == -EINVAL);
    EXPECT(softmm_cpu_park(cpu) == 0);
    EXPECT(softmm_cpu_section_begin(cpu, &s) == -EINVAL && s == NULL); /* parked */
    EXPECT(softmm_cpu_resume(cpu) == 0);
    EXPECT(softmm_cpu_section_begin(cpu, &s) == 0 && s != NULL);
    EXPECT(softmm_cpu_section_begin(cpu, &s2) == -EBUSY && s2 == NULL);
    /* While it is open, the CPU's own calls are refused. */
    EXPECT(softmm_cpu_read_uint(cpu, base, 8, &v, NULL) == -EBUSY);
    EXPECT(softmm_cpu_park(cpu) == -EBUSY);
    EXPECT(softmm_cpu_free(cpu) == -EBUSY);

    /* Accesses: first touches fault pages in inside the section. */
    EXPECT(softmm_section_write_uint(s, base + 8, 8, 40, NULL) == 0);
    EXPECT(softmm_section_read_uint(s, base + 8, 8, &v, NULL) == 0 && v == 40);
    EXPECT(softmm_section_write(s, base + PAGE - 2, "ab", 2, NULL) == 0);
    char buf[4] = {0};
    EXPECT(softmm_section_read(s, base + PAGE - 2, buf, 2, NULL) == 0 && memcmp(buf, "ab", 2) == 0);
    EXPECT(softmm_section_read_uint(s, base + PAGE - 1, 2, &v, NULL) == 0 && v == 'b'); /* across pages */
    EXPECT(softmm_section_atomic_rmw(s, base + 8, 8, SOFTMM_ATOMIC_ADD, 2, 5, &v, NULL) == 0 && v == 40);
    uint64_t expected = 42;
    EXPECT(softmm_section_atomic_cmpxchg(s, base + 8, 8, &expected, 7, 5, NULL) == 0 && expected == 42);
    EXPECT(softmm_section_read_uint(s, base + 8, 8, &v, NULL) == 0 && v == 7);
    /* Faults, as the CPU's accessors report them. */
    EXPECT_FAULT(softmm_section_read_uint(s, base + 3 * PAGE + 8, 8, &v, &f_), SIGSEGV, SEGV_MAPERR, base + 3 * PAGE + 8);
    EXPECT_FAULT(softmm_section_write_uint(s, base + PAGE + 4, 4, 1, &f_), SIGSEGV, SEGV_ACCERR, base + PAGE + 4);
    EXPECT_FAULT(softmm_section_fetch_uint(s, base + 16, 4, &v, &f_), SIGSEGV, SEGV_ACCERR, base + 16);
    EXPECT_FAULT(softmm_section_fetch(s, base, buf, 4, &f_), SIGSEGV, SEGV_ACCERR, base);
    EXPECT_FAULT(softmm_section_atomic_rmw(s, base + 4, 8, SOFTMM_ATOMIC_ADD, 1, 5, &v, &f_), SIGBUS, BUS_ADRALN, base + 4);
    EXPECT_FAULT(softmm_section_read_uint(s, 1ULL << 60, 1, &v, &f_), SIGSEGV, 0x80, 0);
    EXPECT(softmm_section_read_uint(s, base + 3 * PAGE, 1, &v, NULL) == SOFTMM_FAULTED); /* fault may be NULL */
    /* A fault does not end the section. */
    EXPECT(softmm_section_read_uint(s, base + 8, 8, &v, NULL) == 0 && v == 7);
    /* Bad calls. */
    EXPECT(softmm_section_read_uint(s, base, 3, &v, NULL) == -EINVAL);
    EXPECT(softmm_section_read_uint(s, base, 8, NULL, NULL) == -EINVAL);
    EXPECT(softmm_section_write_uint(s, base, 16, 0, NULL) == -EINVAL);
    EXPECT(softmm_section_atomic_rmw(s, base, 8, 42, 1, 5, &v, NULL) == -EINVAL);
    EXPECT(softmm_section_atomic_cmpxchg(s, base, 8, &expected, 1, 9, NULL) == -EINVAL);
    EXPECT(softmm_section_read(s, base, NULL, 4, NULL) == -EFAULT);
    EXPECT(softmm_section_read_uint(NULL, base, 8, &v, NULL) == -EINVAL);
    EXPECT(softmm_section_end(NULL) == -EINVAL);

    /* Another thread may neither use nor end it. */
    struct other_section t = {s, 0, 0};
    pthread_t th;
    EXPECT(pthread_create(&th, NULL, use_section_from_another_thread, &t) == 0);
    pthread_join(th, NULL);
    EXPECT(t.read_rc == -EPERM && t.end_rc == -EPERM);

    /* An unmap on this thread from inside the section: the next access
     * faults instead of reaching the freed frame. */
    EXPECT(softmm_munmap(mm, base, PAGE) == 0);
    EXPECT_FAULT(softmm_section_read_uint(s, base + 8, 8, &v, &f_), SIGSEGV, SEGV_MAPERR, base + 8);

    EXPECT(softmm_section_end(s) == 0);
    EXPECT(softmm_section_end(s) == -EINVAL); /* not open */
    EXPECT(softmm_section_read_uint(s, base + PAGE, 8, &v, NULL) == -EINVAL);
    EXPECT(softmm_cpu_write_uint(cpu, base + 2 * PAGE, 8, 9, NULL) == 0);
    /* The same handle again. */
    EXPECT(softmm_cpu_section_begin(cpu, &s2) == 0 && s2 == s);
    EXPECT(softmm_section_read_uint(s2, base + 2 * PAGE, 8, &v, NULL) == 0 && v == 9);
    EXPECT(softmm_section_end(s2) == 0);

    EXPECT(softmm_cpu_free(cpu) == 0);
    softmm_mm_free(mm);
    softmm_phys_stats st = {1, 1, 1, 1};
    EXPECT(softmm_phys_get_stats(phys, &st) == 0);
    EXPECT(st.frames_used == 0 && st.page_tables == 0 && st.vmas == 0 && st.rmap_entries == 0);
    softmm_phys_free(phys);
}

/* The inline TLB ABI: a miss is the library's (a fill, or a fault with
 * the access's size), a fill makes the inline test hit with the fill's
 * host address, the tags follow the permissions and the alignment, and a
 * call into softmm from inside the section empties the entry. */
static void tlb_abi_contracts(void) {
    softmm_phys *phys;
    softmm_mm *mm;
    softmm_cpu *cpu;
    softmm_section *s = NULL;
    softmm_tlb_abi abi;
    void *host = NULL;
    EXPECT(softmm_phys_new(4 << 20, &phys) == 0);
    EXPECT(softmm_mm_new(phys, &mm) == 0);
    EXPECT(softmm_cpu_new(mm, &cpu) == 0);
    long long a = softmm_mmap(mm, 0, 2 * PAGE, RW, ANON, NULL, 0);
    EXPECT(a > 0);
    uint64_t base = (uint64_t)a, v = 0;
    EXPECT(softmm_cpu_section_begin(cpu, &s) == 0);
    EXPECT(softmm_section_tlb_abi(NULL, &abi) == -EINVAL);
    EXPECT(softmm_section_tlb_abi(s, NULL) == -EINVAL);
    EXPECT(softmm_section_tlb_abi(s, &abi) == 0);
    EXPECT(abi.table != NULL && abi.entries == SOFTMM_TLB_ENTRIES && abi.page_shift == SOFTMM_TLB_PAGE_SHIFT);
    EXPECT(softmm_tlb_lookup(abi.table, base + 8, 8, SOFTMM_ACCESS_READ) == NULL);
    /* The miss path: bad calls, then a fill. */
    EXPECT(softmm_section_tlb_fill(s, base + PAGE - 4, 8, SOFTMM_ACCESS_READ, &host, NULL) == -EINVAL);
    EXPECT(softmm_section_tlb_fill(s, base, 0, SOFTMM_ACCESS_READ, &host, NULL) == -EINVAL);
    EXPECT(softmm_section_tlb_fill(s, base, 8, 3, &host, NULL) == -EINVAL);
    EXPECT(softmm_section_tlb_fill(s, base, 8, SOFTMM_ACCESS_READ, NULL, NULL) == -EINVAL);
    EXPECT(softmm_section_tlb_fill(NULL, base, 8, SOFTMM_ACCESS_READ, &host, NULL) == -EINVAL);
    EXPECT(softmm_section_tlb_fill(s, base + 8, 8, SOFTMM_ACCESS_WRITE, &host, NULL) == 0 && host != NULL);
    EXPECT(softmm_tlb_lookup(abi.table, base + 8, 8, SOFTMM_ACCESS_WRITE) == host);
    EXPECT(softmm_tlb_lookup(abi.table, base + 8, 8, SOFTMM_ACCESS_READ) == host);
    EXPECT(softmm_tlb_lookup(abi.table, base + 12, 8, SOFTMM_ACCESS_READ) == NULL);         /* misaligned */
    EXPECT(softmm_tlb_lookup(abi.table, base + 12, 4, SOFTMM_ACCESS_READ) == (char *)host + 4);
    EXPECT(softmm_tlb_lookup(abi.table, base + 8, 8, SOFTMM_ACCESS_FETCH) == NULL);         /* not executable */
    EXPECT(softmm_tlb_lookup(abi.table, base + PAGE + 8, 8, SOFTMM_ACCESS_READ) == NULL);   /* another page */
    /* The typed helpers, hit and miss alike. */
    EXPECT(softmm_tlb_write_u64(s, abi.table, base + 8, 0x1122334455667788ULL, NULL) == 0);
    EXPECT(softmm_tlb_read_u32(s, abi.table, base + 12, &v, NULL) == 0 && v == 0x11223344);
    EXPECT(softmm_tlb_read_u16(s, abi.table, base + 9, &v, NULL) == 0 && v == 0x6677); /* misaligned: the library's */
    EXPECT(softmm_tlb_write_u16(s, abi.table, base + PAGE - 1, 0xabcd, NULL) == 0);   /* across pages */
    EXPECT(softmm_tlb_read_u8(s, abi.table, base + PAGE, &v, NULL) == 0 && v == 0xab);
    EXPECT(softmm_section_read_uint(s, base + 8, 8, &v, NULL) == 0 && v == 0x1122334455667788ULL);
    EXPECT_FAULT(softmm_tlb_fetch_u32(s, abi.table, base + 8, &v, &f_), SIGSEGV, SEGV_ACCERR, base + 8);
    softmm_fault f = {0};
    EXPECT(softmm_section_tlb_fill(s, base + 2 * PAGE + 8, 4, SOFTMM_ACCESS_READ, &host, &f) == SOFTMM_FAULTED);
    EXPECT(f.signo == SIGSEGV && f.code == SEGV_MAPERR && f.addr == base + 2 * PAGE + 8);
    EXPECT(f.size == 4 && f.access == SOFTMM_ACCESS_READ && f.access_addr == base + 2 * PAGE + 8);
    /* A call into softmm on this thread empties the entry: the inline test
     * misses, and the miss path faults. */
    EXPECT(softmm_tlb_lookup(abi.table, base + 8, 8, SOFTMM_ACCESS_READ) != NULL);
    EXPECT(softmm_munmap(mm, base, PAGE) == 0);
    EXPECT(softmm_tlb_lookup(abi.table, base + 8, 8, SOFTMM_ACCESS_READ) == NULL);
    v = 0x5e5e;
    EXPECT_FAULT(softmm_tlb_read_u64(s, abi.table, base + 8, &v, &f_), SIGSEGV, SEGV_MAPERR, base + 8);
    EXPECT(v == 0x5e5e); /* a faulting load leaves `*out`, as the library's call does */
    EXPECT(softmm_section_end(s) == 0);
    EXPECT(softmm_section_tlb_abi(s, &abi) == -EINVAL); /* not open */
    EXPECT(softmm_section_tlb_fill(s, base + PAGE, 8, SOFTMM_ACCESS_READ, &host, NULL) == -EINVAL);
    EXPECT(softmm_cpu_free(cpu) == 0);
    softmm_mm_free(mm);
    softmm_phys_free(phys);
}

/* Watchpoints: an access of a watched kind overlapping the bytes is an
 * event with the access's kind and size, nothing is stored, others pass;
 * passing one, removing one, bad calls. */
static void watchpoint_contracts(void) {
    softmm_phys *phys;
    softmm_mm *mm;
    softmm_cpu *cpu;
    EXPECT(softmm_phys_new(4 << 20, &phys) == 0);
    EXPECT(softmm_mm_new(phys, &mm) == 0);
    EXPECT(softmm_cpu_new(mm, &cpu) == 0);
    long long a = softmm_mmap(mm, 0, PAGE, RW, ANON, NULL, 0);
    EXPECT(a > 0);
    uint64_t base = (uint64_t)a, v = 0;
    EXPECT(softmm_cpu_write_uint(cpu, base + 8, 8, 5, NULL) == 0);
    EXPECT(softmm_mm_watchpoint_insert(NULL, base, 1, SOFTMM_ACCESS_READ) == -EINVAL);
    EXPECT(softmm_mm_watchpoint_insert(mm, base, 1, 0) == -EINVAL);
    EXPECT(softmm_mm_watchpoint_insert(mm, base, 1, 8) == -EINVAL);
    EXPECT(softmm_mm_watchpoint_insert(mm, base, 0, SOFTMM_ACCESS_READ) == -EINVAL);
    EXPECT(softmm_mm_watchpoint_insert(mm, base + 13, 2, SOFTMM_ACCESS_WRITE) == 0);
    softmm_fault f = {0};
    EXPECT(softmm_cpu_write_uint(cpu, base + 8, 8, 6, &f) == SOFTMM_FAULTED);
    EXPECT(f.signo == 0 && f.code == SOFTMM_EVENT_WATCHPOINT && f.addr == base + 8);
    EXPECT(f.access == SOFTMM_ACCESS_WRITE && f.size == 8 && f.access_addr == base + 8);
    EXPECT(softmm_cpu_read_uint(cpu, base + 8, 8, &v, NULL) == 0 && v == 5); /* not stored; reads pass */
    EXPECT(softmm_cpu_write_uint(cpu, base + 8, 4, 7, NULL) == 0);          /* other bytes pass */
    EXPECT(softmm_cpu_pass_watchpoint(NULL) == -EINVAL);
    EXPECT(softmm_cpu_pass_watchpoint(cpu) == 0);
    EXPECT(softmm_cpu_write_uint(cpu, base + 8, 8, 6, NULL) == 0);
    EXPECT(softmm_cpu_write_uint(cpu, base + 14, 1, 6, NULL) == SOFTMM_FAULTED);
    EXPECT(softmm_mm_watchpoint_remove(mm, base + 13, 2, SOFTMM_ACCESS_READ) == -ENOENT);
    EXPECT(softmm_mm_watchpoint_remove(mm, base + 13, 2, SOFTMM_ACCESS_WRITE) == 0);
    EXPECT(softmm_mm_watchpoint_remove(mm, base + 13, 2, SOFTMM_ACCESS_WRITE) == -ENOENT);
    EXPECT(softmm_cpu_write_uint(cpu, base + 14, 1, 6, NULL) == 0);
    EXPECT(softmm_cpu_free(cpu) == 0);
    softmm_mm_free(mm);
    softmm_phys_free(phys);
}

/* An MMIO region's device: 64 bytes of registers, the calls counted. */
struct regs {
    pthread_mutex_t lock;
    unsigned char bytes[64];
    unsigned reads, writes, released;
    unsigned last_size;
    uint64_t last_offset;
};

static uint64_t regs_read(void *opaque, uint64_t offset, uint32_t size) {
    struct regs *r = opaque;
    uint64_t v = 0;
    pthread_mutex_lock(&r->lock);
    memcpy(&v, r->bytes + offset % 56, size);
    r->reads++;
    r->last_offset = offset;
    r->last_size = size;
    pthread_mutex_unlock(&r->lock);
    return v;
}

static void regs_write(void *opaque, uint64_t offset, uint32_t size, uint64_t value) {
    struct regs *r = opaque;
    pthread_mutex_lock(&r->lock);
    memcpy(r->bytes + offset % 56, &value, size);
    r->writes++;
    r->last_offset = offset;
    r->last_size = size;
    pthread_mutex_unlock(&r->lock);
}

static void regs_release(void *opaque) {
    ((struct regs *)opaque)->released++;
}

struct mmio_guest {
    softmm_mm *mm;
    uint64_t reg;
    int rc;
};

/* A guest thread with a CPU of its own: 1000 stores and loads of its own
 * register. */
static void *mmio_guest_thread(void *arg) {
    struct mmio_guest *g = arg;
    softmm_cpu *cpu;
    g->rc = softmm_cpu_new(g->mm, &cpu);
    for (uint64_t i = 0; i < 1000 && g->rc == 0; i++) {
        uint64_t v = 0;
        g->rc = softmm_cpu_write_uint(cpu, g->reg, 4, i, NULL);
        if (g->rc == 0)
            g->rc = softmm_cpu_read_uint(cpu, g->reg, 4, &v, NULL);
        if (g->rc == 0 && v != i)
            g->rc = -1;
    }
    softmm_cpu_free(cpu);
    return NULL;
}

/* MMIO regions: every size from the CPU and a section, the inline TLB's
 * miss path, bad input, several guest threads, release. */
static void mmio_contracts(void) {
    softmm_phys *phys;
    softmm_mm *mm;
    softmm_cpu *cpu;
    EXPECT(softmm_phys_new(4 << 20, &phys) == 0);
    EXPECT(softmm_mm_new(phys, &mm) == 0);
    EXPECT(softmm_cpu_new(mm, &cpu) == 0);
    static struct regs r = {.lock = PTHREAD_MUTEX_INITIALIZER};
    softmm_mmio_ops ops = {.read = regs_read, .write = regs_write, .release = regs_release};
    softmm_mmio_ops no_read = {.write = regs_write};
    /* Bad input: the errno, nothing mapped, nothing released. */
    EXPECT(softmm_mmio_map(NULL, 0, PAGE, RW, MAP_SHARED, &ops, &r) == -EINVAL);
    EXPECT(softmm_mmio_map(mm, 0, PAGE, RW, MAP_SHARED, NULL, &r) == -EINVAL);
    EXPECT(softmm_mmio_map(mm, 0, PAGE, RW, MAP_SHARED, &no_read, &r) == -EINVAL);
    EXPECT(softmm_mmio_map(mm, 0, 0, RW, MAP_SHARED, &ops, &r) == -EINVAL);
    EXPECT(softmm_mmio_map(mm, 0, PAGE, RW, MAP_PRIVATE, &ops, &r) == -EINVAL);
    EXPECT(softmm_mmio_map(mm, 0x10001, PAGE, RW, MAP_SHARED | MAP_FIXED, &ops, &r) == -EINVAL);
    long long a = softmm_mmap(mm, 0, PAGE, RW, ANON, NULL, 0);
    EXPECT(a > 0);
    EXPECT(softmm_mmio_map(mm, (uint64_t)a, PAGE, RW, MAP_SHARED | MAP_FIXED_NOREPLACE, &ops, &r) == -EEXIST);
    EXPECT(r.released == 0 && r.reads == 0 && r.writes == 0);
    long long io = softmm_mmio_map(mm, 0, PAGE, RW, MAP_SHARED, &ops, &r);
    EXPECT(io > 0);
    uint64_t base = (uint64_t)io, v = 0;
    /* Each size, aligned or not: one call of that size at that offset. */
    for (uint32_t size = 1; size <= 8; size *= 2) {
        EXPECT(softmm_cpu_write_uint(cpu, base + 3, size, 0x1122334455667788ull, NULL) == 0);
        EXPECT(r.last_offset == 3 && r.last_size == size);
        EXPECT(softmm_cpu_read_uint(cpu, base + 3, size, &v, NULL) == 0);
        EXPECT(v == (0x1122334455667788ull & (size == 8 ? ~0ull : (1ull << 8 * size) - 1)));
        EXPECT(r.last_offset == 3 && r.last_size == size);
    }
    /* The inline TLB: the fill has no host address to give (an event);
     * the helpers miss to the section's accessors, which call the device. */
    softmm_section *s;
    EXPECT(softmm_cpu_section_begin(cpu, &s) == 0);
    softmm_tlb_abi abi;
    EXPECT(softmm_section_tlb_abi(s, &abi) == 0);
    void *host = NULL;
    softmm_fault f = {0};
    EXPECT(softmm_section_tlb_fill(s, base + 16, 8, SOFTMM_ACCESS_READ, &host, &f) == SOFTMM_FAULTED);
    EXPECT(f.signo == 0 && f.code == SOFTMM_EVENT_MMIO && f.addr == base + 16 && host == NULL);
    EXPECT(softmm_tlb_write_u64(s, abi.table, base + 16, 42, NULL) == 0);
    EXPECT(softmm_tlb_read_u64(s, abi.table, base + 16, &v, NULL) == 0 && v == 42);
    EXPECT(r.last_offset == 16 && r.last_size == 8);
    EXPECT(softmm_section_end(s) == 0);
    /* Atomics have no device path: the event. */
    EXPECT_FAULT(softmm_cpu_atomic_rmw(cpu, base + 8, 8, SOFTMM_ATOMIC_ADD, 1, 5, &v, &f_), 0, SOFTMM_EVENT_MMIO, base + 8);
    /* Guest threads, each with its own CPU and register. */
    struct mmio_guest g[4];
    pthread_t th[4];
    unsigned before = r.writes;
    for (int i = 0; i < 4; i++) {
        g[i] = (struct mmio_guest){.mm = mm, .reg = base + 32 + 4 * (uint64_t)i};
        EXPECT(pthread_create(&th[i], NULL, mmio_guest_thread, &g[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        EXPECT(g[i].rc == 0);
    }
    EXPECT(r.writes - before == 4000);
    /* fork: the child maps the same device; released with the last mapping. */
    softmm_mm *child;
    EXPECT(softmm_mm_fork(mm, &child) == 0);
    EXPECT(softmm_munmap(mm, base, PAGE) == 0);
    EXPECT(r.released == 0);
    softmm_mm_free(child);
    EXPECT(r.released == 1);
    EXPECT(softmm_cpu_free(cpu) == 0);
    softmm_mm_free(mm);
    softmm_phys_free(phys);
}

/* What an embedder needs besides system calls and accesses: structured
 * regions, statistics, pins, NUMA policy, hugetlbfs, overcommit. */
static void complete_api_contracts(void) {
    /* Size versions: a 0.1.0 program's config (no hugepages field) still
     * works; a newer header's larger one only with its new fields zero. */
    struct phys_config_0_1_0 {
        uint32_t size, nodes;
        uint64_t bytes;
        int32_t on_demand;
    } old = {sizeof old, 1, 1 << 20, 0};
    softmm_phys *p = NULL;
    EXPECT(softmm_phys_new_config((const softmm_phys_config *)(const void *)&old, &p) == 0);
    softmm_meminfo old_mi = {.size = sizeof old_mi};
    EXPECT(softmm_phys_get_meminfo(p, &old_mi) == 0 && old_mi.hugepages_total == 0);
    softmm_phys_free(p);
    struct {
        softmm_phys_config c;
        uint64_t future;
    } newer;
    memset(&newer, 0, sizeof newer);
    softmm_phys_config_default(&newer.c);
    newer.c.bytes = 1 << 20;
    newer.c.size = sizeof newer;
    newer.future = 1;
    EXPECT(softmm_phys_new_config(&newer.c, &p) == -E2BIG);
    newer.future = 0;
    EXPECT(softmm_phys_new_config(&newer.c, &p) == 0);
    softmm_phys_free(p);
    struct {
        softmm_cpu_stats s;
        uint64_t future;
    } bigger = {.s = {.size = sizeof bigger}, .future = 99};
    softmm_cpu *c0 = NULL;
    EXPECT(softmm_cpu_new(NULL, &c0) == 0);
    EXPECT(softmm_cpu_get_stats(c0, &bigger.s) == 0 && bigger.s.size == sizeof(softmm_cpu_stats) && bigger.future == 0);
    EXPECT(softmm_cpu_free(c0) == 0);

    softmm_phys_config pc;
    softmm_phys_config_default(&pc);
    EXPECT(pc.hugepages == 0);
    pc.bytes = 16 << 20;
    pc.nodes = 2;
    pc.hugepages = 1; /* per node */
    softmm_phys *phys = NULL;
    EXPECT(softmm_phys_new_config(&pc, &phys) == 0);
    softmm_mm_config mc;
    softmm_mm_config_default(&mc);
    mc.cap_sys_nice = 1;
    mc.migrate_policy = "no-such";
    softmm_mm *mm = NULL;
    EXPECT(softmm_mm_new_config(phys, &mc, &mm) == -EINVAL && mm == NULL);
    mc.migrate_policy = "batched";
    EXPECT(softmm_mm_new_config(phys, &mc, &mm) == 0);

    /* Regions: listxattr's sizing, then the array. */
    long long a = softmm_mmap(mm, 0, 2 * PAGE, RW, ANON, NULL, 0);
    long long r = softmm_mmap(mm, 0, PAGE, PROT_READ, MAP_SHARED | MAP_ANONYMOUS, NULL, 0);
    EXPECT(a > 0 && r > 0);
    size_t count = 0;
    EXPECT(softmm_mm_regions(mm, NULL, sizeof(softmm_region), &count) == 2 && count == 2);
    softmm_region regions[4];
    count = 1;
    EXPECT(softmm_mm_regions(mm, regions, sizeof(softmm_region), &count) == -ERANGE && count == 2);
    count = 4;
    EXPECT(softmm_mm_regions(mm, regions, sizeof(softmm_region), &count) == 2 && count == 2);
    EXPECT(softmm_mm_regions(mm, regions, 8, &count) == -EINVAL);
    EXPECT(softmm_mm_regions(NULL, regions, sizeof(softmm_region), &count) == -EINVAL);
    int seen = 0;
    for (size_t i = 0; i < 2; i++) {
        const softmm_region *g = &regions[i];
        if (g->start == (uint64_t)a)
            seen += g->end == (uint64_t)a + 2 * PAGE && g->prot == RW && g->flags == MAP_PRIVATE && g->name[0] == 0;
        if (g->start == (uint64_t)r)
            seen += g->prot == PROT_READ && g->flags == MAP_SHARED && g->size == sizeof(softmm_region);
    }
    EXPECT(seen == 2);

    /* Statistics: the caller sets size. */
    softmm_cpu *cpu = NULL;
    EXPECT(softmm_cpu_new(mm, &cpu) == 0);
    EXPECT(softmm_cpu_write_uint(cpu, (uint64_t)a, 8, 7, NULL) == 0);
    softmm_cpu_stats cs = {.size = sizeof cs};
    EXPECT(softmm_cpu_get_stats(cpu, &cs) == 0 && cs.faults == 1 && cs.size == sizeof cs);
    softmm_mm_stats ms = {.size = sizeof ms};
    EXPECT(softmm_mm_get_stats(mm, &ms) == 0 && ms.map_count == 2 && ms.rss_pages == 1);
    ms.size = 4;
    EXPECT(softmm_mm_get_stats(mm, &ms) == -EINVAL);
    softmm_meminfo mi = {.size = sizeof mi};
    EXPECT(softmm_phys_get_meminfo(phys, &mi) == 0 && mi.nodes == 2 && mi.hugepages_total == 2);
    EXPECT(mi.committed_pages == 3); /* the private writable pages and the shared anonymous (shmem) one */
    if (mi.committed_pages != 3)
        fprintf(stderr, "  committed %llu\n", (unsigned long long)mi.committed_pages);
    softmm_node_stats ns = {.size = sizeof ns};
    EXPECT(softmm_phys_get_node_stats(phys, 1, &ns) == 0 && ns.hugepages_total == 1);
    EXPECT(softmm_phys_get_node_stats(phys, 2, &ns) == -ENODEV);
    EXPECT(softmm_phys_get_node_stats(phys, 7, NULL) == -EINVAL); /* the output first */

    /* Pins: the device's view outlives the mapping. */
    softmm_pinned *pin = NULL;
    EXPECT(softmm_pin_user_pages(mm, (uint64_t)a, 2, 0x2 /* FOLL_PIN: internal */, &pin) == -EINVAL);
    EXPECT(softmm_pin_user_pages(mm, (uint64_t)a, 2, SOFTMM_FOLL_WRITE | SOFTMM_FOLL_LONGTERM, &pin) == 0);
    EXPECT(softmm_pinned_npages(pin) == 2);
    uint64_t v = 0;
    EXPECT(softmm_pinned_read(pin, 0, &v, sizeof v) == 0 && v == 7);
    v = 42;
    EXPECT(softmm_pinned_write(pin, PAGE, &v, sizeof v) == 0);
    EXPECT(softmm_cpu_read_uint(cpu, (uint64_t)a + PAGE, 8, &v, NULL) == 0 && v == 42);
    EXPECT(softmm_pinned_read(pin, 2 * PAGE - 4, &v, sizeof v) == -EFAULT);
    EXPECT(softmm_mm_get_stats(mm, &ms) == -EINVAL); /* still size 4 */
    ms.size = sizeof ms;
    EXPECT(softmm_mm_get_stats(mm, &ms) == 0 && ms.pinned_vm == 2);
    EXPECT(softmm_munmap(mm, (uint64_t)a, 2 * PAGE) == 0);
    EXPECT(softmm_pinned_read(pin, PAGE, &v, sizeof v) == 0 && v == 42);
    EXPECT(softmm_pinned_unpin(pin, 1) == 0 && softmm_pinned_unpin(pin, 1) == -EINVAL);
    EXPECT(softmm_pinned_read(pin, 0, &v, sizeof v) == -EINVAL);
    softmm_pinned_free(pin);
    softmm_pinned_free(NULL);
    long long ro = softmm_mmap(mm, 0, PAGE, PROT_READ, ANON, NULL, 0);
    EXPECT(softmm_get_user_pages(mm, (uint64_t)ro, 1, SOFTMM_FOLL_LONGTERM, &pin) == -EINVAL);
    EXPECT(softmm_get_user_pages(mm, (uint64_t)ro, 1, 0, &pin) == 0);
    EXPECT(softmm_pinned_write(pin, 0, &v, 1) == -EPERM);
    softmm_pinned_free(pin);

    /* NUMA: bind to node 1, move to node 0, migrate back. */
    uint64_t node0 = 1, node1 = 2;
    EXPECT(softmm_set_mempolicy(mm, 99, &node1, 3) == -EINVAL);
    EXPECT(softmm_set_mempolicy(mm, MPOL_BIND, &node1, 3) == 0);
    long long n = softmm_mmap(mm, 0, PAGE, RW, ANON | MAP_POPULATE, NULL, 0);
    uint64_t page = (uint64_t)n;
    int status = -1, to = 0;
    EXPECT(softmm_move_pages(mm, 1, &page, NULL, &status, 0) == 0 && status == 1);
    EXPECT(softmm_move_pages(mm, 1, &page, &to, &status, 0) == 0 && status == 0);
    to = 5;
    EXPECT(softmm_move_pages(mm, 1, &page, &to, &status, 0) == -ENODEV);
    /* Linux's order: the flags before the arrays are read. */
    EXPECT(softmm_move_pages(mm, 1, NULL, NULL, NULL, 0x8) == -EINVAL);
    EXPECT(softmm_move_pages(mm, 1, NULL, NULL, NULL, 0) == -EFAULT);
    /* mincore checks the range before it writes the vector. */
    EXPECT(softmm_mincore(mm, page + 1, PAGE, NULL) == -EINVAL);
    EXPECT(softmm_mincore(mm, page, PAGE, NULL) == -EFAULT);
    EXPECT(softmm_migrate_pages(mm, 3, &node0, &node1) == 0);
    EXPECT(softmm_move_pages(mm, 1, &page, NULL, &status, 0) == 0 && status == 1);
    EXPECT(softmm_mbind(mm, page, PAGE, MPOL_BIND, &node0, 3, MPOL_MF_MOVE) == 0);
    EXPECT(softmm_move_pages(mm, 1, &page, NULL, &status, 0) == 0 && status == 0);
    EXPECT(softmm_mbind(mm, page + 1, PAGE, MPOL_BIND, &node0, 3, 0) == -EINVAL);
    int mode = -1;
    uint64_t mask[2] = {~0ULL, ~0ULL};
    EXPECT(softmm_get_mempolicy(mm, &mode, mask, 66, 0, 0) == 0 && mode == MPOL_BIND && mask[0] == 2 && mask[1] == 0);
    EXPECT(softmm_get_mempolicy(mm, &mode, mask, 3, page, MPOL_F_ADDR) == 0 && mode == MPOL_BIND && mask[0] == 1);
    EXPECT(softmm_get_mempolicy(mm, &mode, NULL, 0, page, MPOL_F_NODE | MPOL_F_ADDR) == 0 && mode == 0);
    EXPECT(softmm_get_mempolicy(mm, &mode, mask, 1, 0, 0) == -EINVAL); /* below the 2 nodes */
    EXPECT(softmm_get_mempolicy(mm, NULL, NULL, 0, page, 0) == -EINVAL);
    EXPECT(softmm_get_mempolicy(mm, NULL, mask, 1ULL << 40, 0, 0) == -EINVAL);

    /* hugetlbfs: pages from the pool, fallocate's order of checks. */
    softmm_file *huge = NULL, *huge_ro = NULL;
    const uint64_t HPAGE = 2ULL << 20;
    EXPECT(softmm_file_create_hugetlbfs(phys, "huge", PAGE, O_RDWR, &huge) == -EINVAL);
    EXPECT(softmm_file_create_hugetlbfs(phys, "huge", HPAGE, O_RDWR, &huge) == 0);
    EXPECT(softmm_file_create_hugetlbfs(phys, "huge-ro", HPAGE, O_RDONLY, &huge_ro) == 0);
    EXPECT(softmm_file_fallocate(huge_ro, 0, 0, 0) == -EINVAL);
    EXPECT(softmm_file_fallocate(huge_ro, 0, 0, 1) == -EBADF);
    EXPECT(softmm_file_fallocate(huge, 0, 0, (long long)(3 * HPAGE)) == -ENOSPC);
    uint64_t fsize = 0;
    EXPECT(softmm_file_get_size(huge, &fsize) == 0 && fsize == HPAGE); /* not grown on failure */
    EXPECT(softmm_phys_get_meminfo(phys, &mi) == 0 && mi.hugepages_free == 0);
    EXPECT(softmm_file_fallocate(huge, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (long long)(2 * HPAGE)) == 0);
    long long h = softmm_mmap(mm, 0, HPAGE, RW, MAP_SHARED, huge, 0);
    EXPECT(h > 0 && (uint64_t)h % HPAGE == 0);
    EXPECT(softmm_phys_get_meminfo(phys, &mi) == 0 && mi.hugepages_rsvd == 1);
    count = 4;
    EXPECT(softmm_mm_regions(mm, regions, sizeof(softmm_region), &count) >= 0);
    int named = 0;
    for (size_t i = 0; i < count; i++)
        named += regions[i].start == (uint64_t)h && strcmp(regions[i].name, "huge") == 0 &&
                 regions[i].name_len == 4 && regions[i].flags == MAP_SHARED;
    EXPECT(named == 1);

    /* Overcommit: never, with the limit at the arena. */
    softmm_overcommit oc = {.size = sizeof oc};
    EXPECT(softmm_phys_get_overcommit(phys, &oc) == 0 && oc.mode == 0 && oc.ratio == 50);
    oc.mode = 3;
    EXPECT(softmm_phys_set_overcommit(phys, &oc) == -EINVAL);
    oc.mode = 2;
    oc.ratio = 100;
    EXPECT(softmm_phys_set_overcommit(phys, &oc) == 0);
    EXPECT(softmm_mmap(mm, 0, 64 << 20, RW, ANON, NULL, 0) == -ENOMEM);
    EXPECT(softmm_mmap(mm, 0, 64 << 20, PROT_READ, ANON, NULL, 0) > 0); /* not charged */

    EXPECT(softmm_cpu_free(cpu) == 0);
    softmm_file_free(huge);
    softmm_file_free(huge_ro);
    softmm_mm_free(mm);
    softmm_phys_stats s;
    EXPECT(softmm_phys_get_stats(phys, &s) == 0 && s.frames_used == 0 && s.vmas == 0);
    softmm_phys_free(phys);
}

/* softmm_mm_config.atomic_alignment: an atomic across a word and across
 * a page is made under "split", with every other thread's atomics on the
 * same bytes, and faults with SIGBUS/BUS_ADRALN under "strict" (the
 * default, and what NULL selects). */
struct split_counter {
    softmm_mm *mm;
    uint64_t addr;
    int failed;
};

static void *split_adder(void *arg) {
    struct split_counter *c = arg;
    softmm_cpu *cpu;
    if (softmm_cpu_new(c->mm, &cpu) != 0) {
        c->failed = 1;
        return NULL;
    }
    for (int i = 0; i < 1000; i++)
        if (softmm_cpu_atomic_rmw(cpu, c->addr, 4, SOFTMM_ATOMIC_ADD, 1, 5, NULL, NULL) != 0)
            c->failed = 1;
    softmm_cpu_free(cpu);
    return NULL;
}

static void atomic_alignment_contracts(void) {
    softmm_phys *phys;
    EXPECT(softmm_phys_new(4 << 20, &phys) == 0);
    const char *policies[] = {NULL, "strict", "split"};
    for (int p = 0; p < 3; p++) {
        softmm_mm_config mc;
        softmm_mm_config_default(&mc);
        EXPECT(mc.atomic_alignment == NULL);
        mc.atomic_alignment = policies[p];
        softmm_mm *mm = NULL;
        EXPECT(softmm_mm_new_config(phys, &mc, &mm) == 0);
        softmm_cpu *cpu;
        EXPECT(softmm_cpu_new(mm, &cpu) == 0);
        long long a = softmm_mmap(mm, 0, 2 * PAGE, RW, ANON, NULL, 0);
        EXPECT(a > 0);
        uint64_t base = (uint64_t)a, v = 0;
        uint64_t across_word = base + 6, across_page = base + PAGE - 2;
        if (p < 2) {
            EXPECT_FAULT(softmm_cpu_atomic_rmw(cpu, across_word, 4, SOFTMM_ATOMIC_ADD, 1, 5, &v, &f_), SIGBUS,
                         BUS_ADRALN, across_word);
            EXPECT_FAULT(softmm_cpu_atomic_rmw(cpu, across_page, 4, SOFTMM_ATOMIC_ADD, 1, 5, &v, &f_), SIGBUS,
                         BUS_ADRALN, across_page);
            EXPECT(softmm_cpu_read_uint(cpu, across_page, 4, &v, NULL) == 0 && v == 0); /* not made */
        } else {
            EXPECT(softmm_cpu_write_uint(cpu, across_word, 4, 0x01020304, NULL) == 0);
            EXPECT(softmm_cpu_atomic_rmw(cpu, across_word, 4, SOFTMM_ATOMIC_ADD, 1, 5, &v, NULL) == 0);
            EXPECT(v == 0x01020304);
            EXPECT(softmm_cpu_read_uint(cpu, across_word, 4, &v, NULL) == 0 && v == 0x01020305);
            /* Two threads add across the page boundary: no count lost. */
            struct split_counter c = {mm, across_page, 0};
            pthread_t t[2];
            for (int i = 0; i < 2; i++)
                EXPECT(pthread_create(&t[i], NULL, split_adder, &c) == 0);
            for (int i = 0; i < 2; i++)
                pthread_join(t[i], NULL);
            EXPECT(c.failed == 0);
            EXPECT(softmm_cpu_read_uint(cpu, across_page, 4, &v, NULL) == 0 && v == 2000);
        }
        EXPECT(softmm_cpu_free(cpu) == 0);
        softmm_mm_free(mm);
    }
    softmm_mm_config mc;
    softmm_mm_config_default(&mc);
    mc.atomic_alignment = "bus-lock";
    softmm_mm *mm = NULL;
    EXPECT(softmm_mm_new_config(phys, &mc, &mm) == -EINVAL && mm == NULL);
    softmm_phys_free(phys);
}

int main(void) {
    softmm_phys *phys;
    softmm_mm *mm;
    EXPECT(softmm_phys_new(1 << 20, NULL) == -EINVAL);
    EXPECT(softmm_phys_new(0, &phys) == -EINVAL);
    EXPECT(softmm_phys_new(4 << 20, &phys) == 0);
    EXPECT(softmm_mm_new(NULL, &mm) == -EINVAL);
    EXPECT(softmm_mm_new(phys, &mm) == 0);

    /* errno results, in Linux's order of checks. */
    EXPECT(softmm_munmap(NULL, 0x10000, PAGE) == -EINVAL);
    EXPECT(softmm_mmap(mm, 0, 0, RW, ANON, NULL, 0) == -EINVAL);
    EXPECT(softmm_mmap(mm, 0, PAGE, RW, MAP_PRIVATE, NULL, 0) == -EBADF);
    EXPECT(softmm_mmap(mm, 0, PAGE, RW, ANON | MAP_FIXED, NULL, 0) == -EPERM); /* below mmap_min_addr */
    EXPECT(softmm_munmap(mm, 0x10001, PAGE) == -EINVAL);
    EXPECT(softmm_mprotect(mm, 0x10000, PAGE, PROT_READ) == -ENOMEM);
    long long a = softmm_mmap(mm, 0, 4 * PAGE, RW, ANON, NULL, 0);
    EXPECT(a > 0);
    EXPECT(softmm_mmap(mm, (uint64_t)a, PAGE, RW, ANON | MAP_FIXED_NOREPLACE, NULL, 0) == -EEXIST);
    EXPECT(softmm_madvise(mm, (uint64_t)a, PAGE, 12345) == -EINVAL);
    /* A failed call changes nothing. */
    EXPECT(softmm_mm_maps(mm, maps_before, sizeof maps_before) > 0);
    EXPECT(softmm_mremap(mm, (uint64_t)a, PAGE, 2 * PAGE, 0, 0) == -ENOMEM); /* no room in place */
    EXPECT(softmm_mremap(mm, (uint64_t)a + 1, PAGE, PAGE, 0, 0) == -EINVAL);
    EXPECT(softmm_mprotect(mm, (uint64_t)a, 8 * PAGE, PROT_READ) == -ENOMEM); /* a hole after: applied up to it, as Linux */
    EXPECT(softmm_mprotect(mm, (uint64_t)a, 4 * PAGE, RW) == 0);
    EXPECT(softmm_mm_maps(mm, maps_after, sizeof maps_after) > 0);
    EXPECT(strcmp(maps_before, maps_after) == 0);

    /* Locks, seals and MDWE, with Linux's errnos, on a mapping of their own
     * (sealed for good) with a hole after it. */
    long long l = softmm_mmap(mm, 0, 5 * PAGE, RW, ANON, NULL, 0);
    EXPECT(l > 0 && softmm_munmap(mm, (uint64_t)l + 4 * PAGE, PAGE) == 0);
    EXPECT(softmm_mlock2(mm, (uint64_t)l, PAGE, 2) == -EINVAL);
    EXPECT(softmm_mlock(mm, (uint64_t)l, PAGE) == 0);
    EXPECT(softmm_mlock2(mm, (uint64_t)l + PAGE, PAGE, 1 /* MLOCK_ONFAULT */) == 0);
    EXPECT(softmm_munlock(mm, (uint64_t)l, 2 * PAGE) == 0);
    EXPECT(softmm_mlockall(mm, 4 /* MCL_ONFAULT alone */) == -EINVAL);
    EXPECT(softmm_mlockall(mm, 2 /* MCL_FUTURE */) == 0);
    EXPECT(softmm_munlockall(mm) == 0);
    EXPECT(softmm_mseal(mm, (uint64_t)l, PAGE, 1) == -EINVAL);
    EXPECT(softmm_mseal(mm, (uint64_t)l + 3 * PAGE, 2 * PAGE, 0) == -ENOMEM); /* a hole */
    EXPECT(softmm_mseal(mm, (uint64_t)l + 3 * PAGE, PAGE, 0) == 0);
    EXPECT(softmm_munmap(mm, (uint64_t)l + 3 * PAGE, PAGE) == -EPERM);
    EXPECT(softmm_prctl_get_mdwe(mm) == 0);
    EXPECT(softmm_prctl_set_mdwe(mm, 2 /* NO_INHERIT alone */) == -EINVAL);
    EXPECT(softmm_prctl_set_mdwe(mm, 1 /* PR_MDWE_REFUSE_EXEC_GAIN */) == 0);
    EXPECT(softmm_prctl_get_mdwe(mm) == 1);
    EXPECT(softmm_mprotect(mm, (uint64_t)l, PAGE, RW | PROT_EXEC) == -EACCES);

    /* Files: the open mode decides, as for a file descriptor. */
    softmm_file *ro, *rw;
    EXPECT(softmm_file_create(phys, "ro", PAGE, 3, &ro) == -EINVAL);
    EXPECT(softmm_file_create(phys, "ro", PAGE, O_RDONLY, &ro) == 0);
    EXPECT(softmm_file_create(phys, "rw", PAGE, O_RDWR, &rw) == 0);
    EXPECT(softmm_mmap(mm, 0, PAGE, RW, MAP_SHARED, ro, 0) == -EACCES);
    EXPECT(softmm_mmap(mm, 0, PAGE, RW, MAP_SHARED, ro, 1) == -EINVAL);
    EXPECT(softmm_file_pwrite(ro, "x", 1, 0) == -EBADF);
    EXPECT(softmm_file_truncate(ro, 0) == -EINVAL);
    EXPECT(softmm_file_pwrite(rw, "hello", 5, 0) == 5);
    char buf[8] = {0};
    EXPECT(softmm_file_pread(rw, buf, sizeof buf, 0) == sizeof buf && memcmp(buf, "hello", 6) == 0);
    EXPECT(softmm_file_pread(rw, buf, sizeof buf, 2 * PAGE) == 0);
    /* A negative offset is -EINVAL before the open mode is looked at
     * (ksys_pread64, ksys_pwrite64); a size past INT64_MAX too. */
    softmm_file *wo, *big = NULL;
    EXPECT(softmm_file_create(phys, "wo", PAGE, O_WRONLY, &wo) == 0);
    EXPECT(softmm_file_pwrite(ro, "x", 1, 1ULL << 63) == -EINVAL);
    EXPECT(softmm_file_pread(wo, buf, sizeof buf, 1ULL << 63) == -EINVAL);
    EXPECT(softmm_file_create(phys, "big", 1ULL << 63, O_RDWR, &big) == -EINVAL && big == NULL);
    softmm_file_free(wo);

    /* Faults as {signo, code, addr}. */
    softmm_cpu *cpu;
    EXPECT(softmm_cpu_new(mm, &cpu) == 0);
    uint64_t v = 0;
    uint64_t base = (uint64_t)a;
    EXPECT(softmm_munmap(mm, base + 3 * PAGE, PAGE) == 0);
    EXPECT(softmm_mprotect(mm, base + PAGE, PAGE, PROT_READ) == 0);
    EXPECT_FAULT(softmm_cpu_read_uint(cpu, base + 3 * PAGE + 8, 8, &v, &f_), SIGSEGV, SEGV_MAPERR, base + 3 * PAGE + 8);
    EXPECT_FAULT(softmm_cpu_write_uint(cpu, base + PAGE + 4, 4, 1, &f_), SIGSEGV, SEGV_ACCERR, base + PAGE + 4);
    EXPECT_FAULT(softmm_cpu_fetch_uint(cpu, base + 16, 4, &v, &f_), SIGSEGV, SEGV_ACCERR, base + 16);
    EXPECT_FAULT(softmm_cpu_atomic_rmw(cpu, base + 4, 8, SOFTMM_ATOMIC_ADD, 1, 5, &v, &f_), SIGBUS, BUS_ADRALN, base + 4);
    EXPECT_FAULT(softmm_cpu_read_uint(cpu, 1ULL << 60, 1, &v, &f_), SIGSEGV, 0x80, 0);
    /* A write across into the read-only page stores the bytes before it. */
    EXPECT_FAULT(softmm_cpu_write(cpu, base + PAGE - 2, "abcd", 4, &f_), SIGSEGV, SEGV_ACCERR, base + PAGE);
    EXPECT(softmm_cpu_read(cpu, base + PAGE - 2, buf, 4, NULL) == 0 && memcmp(buf, "ab\0\0", 4) == 0);
    EXPECT(softmm_cpu_read_uint(cpu, base + 3 * PAGE, 1, &v, NULL) == SOFTMM_FAULTED); /* fault may be NULL */
    /* SIGBUS past the end of a file. */
    long long fm = softmm_mmap(mm, 0, 2 * PAGE, PROT_READ, MAP_SHARED, rw, 0);
    EXPECT(fm > 0);
    EXPECT(softmm_cpu_read_uint(cpu, (uint64_t)fm, 4, &v, NULL) == 0 && v == 0x6c6c6568);
    EXPECT_FAULT(softmm_cpu_read_uint(cpu, (uint64_t)fm + PAGE + 1, 1, &v, &f_), SIGBUS, BUS_ADRERR, (uint64_t)fm + PAGE + 1);

    /* Bad calls on a CPU. */
    EXPECT(softmm_cpu_read_uint(cpu, base, 3, &v, NULL) == -EINVAL);
    EXPECT(softmm_cpu_read_uint(cpu, base, 8, NULL, NULL) == -EINVAL);
    EXPECT(softmm_cpu_atomic_rmw(cpu, base, 8, 42, 1, 5, &v, NULL) == -EINVAL);
    EXPECT(softmm_cpu_atomic_rmw(cpu, base, 8, SOFTMM_ATOMIC_ADD, 1, 9, &v, NULL) == -EINVAL);
    EXPECT(softmm_cpu_read_uint(NULL, base, 8, &v, NULL) == -EINVAL);
    EXPECT(softmm_cpu_park(cpu) == 0);
    EXPECT(softmm_cpu_read_uint(cpu, base, 8, &v, NULL) == -EINVAL);
    EXPECT(softmm_cpu_resume(cpu) == 0);
    EXPECT(softmm_cpu_detach(cpu) == 0);
    EXPECT(softmm_cpu_read_uint(cpu, base, 8, &v, NULL) == -EINVAL);
    EXPECT(softmm_cpu_attach(cpu, mm) == 0);

    /* Atomics. */
    EXPECT(softmm_cpu_write_uint(cpu, base + 8, 8, 40, NULL) == 0);
    EXPECT(softmm_cpu_atomic_rmw(cpu, base + 8, 8, SOFTMM_ATOMIC_ADD, 2, 5, &v, NULL) == 0 && v == 40);
    uint64_t expected = 7;
    EXPECT(softmm_cpu_atomic_cmpxchg(cpu, base + 8, 8, &expected, 1, 5, NULL) == 0 && expected == 42);
    EXPECT(softmm_cpu_atomic_cmpxchg(cpu, base + 8, 8, &expected, 1, 4, NULL) == 0 && expected == 42);
    EXPECT(softmm_cpu_read_uint(cpu, base + 8, 8, &v, NULL) == 0 && v == 1);
    EXPECT(softmm_cpu_atomic_rmw(cpu, base + 8, 2, SOFTMM_ATOMIC_SUB, 2, 0, &v, NULL) == 0 && v == 1);
    EXPECT(softmm_cpu_read_uint(cpu, base + 8, 8, &v, NULL) == 0 && v == 0xffff);

    /* Another thread may not use this thread's CPU. */
    struct other_thread t = {cpu, 0, 0};
    pthread_t th;
    EXPECT(pthread_create(&th, NULL, use_from_another_thread, &t) == 0);
    pthread_join(th, NULL);
    EXPECT(t.read_rc == -EPERM && t.free_rc == -EPERM);
    EXPECT(softmm_cpu_read_uint(cpu, base + 8, 8, &v, NULL) == 0);

    /* The maps text, snprintf style. */
    long long len = softmm_mm_maps(mm, NULL, 0);
    EXPECT(len > 0);
    char small[10];
    EXPECT(softmm_mm_maps(mm, small, sizeof small) == len && strlen(small) == sizeof small - 1);

    /* Free in any order; nothing leaks. */
    softmm_mm_free(mm);
    softmm_file_free(ro);
    EXPECT(softmm_cpu_free(cpu) == 0);
    softmm_file_free(rw);
    softmm_cpu_free(NULL);
    softmm_mm_free(NULL);
    softmm_phys_stats s = {1, 1, 1, 1};
    EXPECT(softmm_phys_get_stats(phys, &s) == 0);
    EXPECT(s.frames_used == 0 && s.page_tables == 0 && s.vmas == 0 && s.rmap_entries == 0);
    softmm_phys_free(phys);

    embedder_contracts();
    section_contracts();
    tlb_abi_contracts();
    watchpoint_contracts();
    atomic_alignment_contracts();
    mmio_contracts();
    complete_api_contracts();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
