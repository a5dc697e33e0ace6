/*
 * A tiny emulator on softmm's C API: a loader maps a text page (written,
 * then made read+exec as an ELF loader would) and a data page, an
 * interpreter loop fetches and executes 4-byte toy instructions through a
 * CPU, one access section per basic block whose TLB hits are tested inline
 * (the header's softmm_tlb_* helpers over softmm_section_tlb_abi, as
 * QEMU's generated code does; a miss calls into the library), and guest
 * faults become guest signals: a store into the text page
 * and a load from a hole are skipped like a SIGSEGV handler would, a jump
 * into the data page stops the guest. Then a second guest runs through a
 * translation cache: the emulator decodes a code page once, watches it
 * for stores (softmm_mm_write_watch, notify mode: the guest's own
 * protections are unchanged), and when the guest rewrites its own code
 * the store comes back as an event, the translation is dropped and the
 * store retried; a dirty log (log mode) names the pages the guest wrote,
 * which are copied as a snapshot. A debugger's watchpoint stops the
 * guest before each store to a variable and resumes it past the store.
 * A UART's registers are an MMIO region (softmm_mmio_map) whose loads and
 * stores call the emulator's callbacks. Then the guest forks (copy on write),
 * prints its regions and counters, and everything is freed with no leak.
 *
 * Build: cc -I include examples/emulator.c libsoftmm_capi.a -lpthread -ldl -lm
 * (crates/softmm-capi/tests/c.rs builds and runs it in the test suite.)
 */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MAP_GROWSDOWN, MREMAP_MAYMOVE under -std=c11 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "softmm.h"

#define CHECK(call)                                                                    \
    do {                                                                               \
        long long r_ = (call);                                                         \
        if (r_ < 0) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, strerror((int)-r_)); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

enum { HALT, LI, LD, ST, ADD, ADDI, BNZ, JR };
#define INSN(op, rd, rs, imm) \
    ((uint32_t)(op) | (uint32_t)(rd) << 8 | (uint32_t)(rs) << 12 | (uint32_t)(uint16_t)(imm) << 16)

struct vcpu {
    softmm_cpu *cpu;
    uint64_t r[16];
    uint64_t pc;
};

/* Runs until HALT (0) or a fault (SOFTMM_FAULTED, with pc at the faulting
 * instruction, as a precise exception leaves it). Each basic block runs in
 * one access section (its accesses pay the TLB lookup alone); the section
 * ends at a taken branch and before returning, so the thread never blocks
 * with one open. */
static int run(struct vcpu *v, softmm_fault *f) {
    softmm_section *s;
    softmm_tlb_abi abi;
    int rc;
    CHECK(softmm_cpu_section_begin(v->cpu, &s));
    /* The CPU's TLB table: at the same address for the CPU's life, read
     * only while a section of it is open, an entry anew for each access. */
    CHECK(softmm_section_tlb_abi(s, &abi));
    const softmm_tlb_entry *tlb = abi.table;
    for (;;) {
        uint64_t insn;
        rc = softmm_tlb_fetch_u32(s, tlb, v->pc, &insn, f);
        if (rc != 0)
            break;
        unsigned op = insn & 0xff, rd = insn >> 8 & 15, rs = insn >> 12 & 15;
        int64_t imm = (int16_t)(insn >> 16);
        int block_end = 0;
        v->pc += 4;
        switch (op) {
        case HALT: CHECK(softmm_section_end(s)); return 0;
        case LI: v->r[rd] = (uint64_t)imm; break;
        case LD: rc = softmm_tlb_read_u64(s, tlb, v->r[rs], &v->r[rd], f); break;
        case ST: rc = softmm_tlb_write_u64(s, tlb, v->r[rd], v->r[rs], f); break;
        case ADD: v->r[rd] += v->r[rs]; break;
        case ADDI: v->r[rd] += (uint64_t)imm; break;
        case BNZ: if (v->r[rd] != 0) { v->pc += (uint64_t)(imm * 4) - 4; block_end = 1; } break;
        case JR: v->pc = v->r[rd]; block_end = 1; break;
        default: fprintf(stderr, "illegal instruction %#llx\n", (unsigned long long)insn); exit(1);
        }
        if (rc != 0) {
            v->pc -= 4;
            break;
        }
        if (block_end) { /* the next block, in a new section */
            CHECK(softmm_section_end(s));
            CHECK(softmm_cpu_section_begin(v->cpu, &s));
        }
    }
    CHECK(softmm_section_end(s));
    return rc;
}

/* A translation cache of one page: its instructions decoded once, valid
 * until the guest stores to the page (a write-watch event). */
struct tcache {
    uint64_t page; /* 0: empty */
    uint32_t insn[1024];
    unsigned translations;
};

/* Runs from the translation cache until HALT (0) or a guest fault
 * (SOFTMM_FAULTED). A store to a translated page returns an event (signo
 * 0, SOFTMM_EVENT_WRITE_WATCH) before it is made: the translation is
 * dropped, the page unwatched, and the store retried. */
static int run_translated(softmm_mm *mm, struct vcpu *v, struct tcache *tc, softmm_fault *f) {
    for (;;) {
        uint64_t page = v->pc & ~4095ull;
        if (tc->page != page) {
            int rc = softmm_cpu_fetch(v->cpu, page, tc->insn, sizeof tc->insn, f);
            if (rc != 0)
                return rc;
            CHECK(softmm_mm_write_watch(mm, page, 4096, SOFTMM_WATCH_NOTIFY));
            tc->page = page;
            tc->translations++;
        }
        uint32_t insn = tc->insn[(v->pc & 4095) / 4];
        unsigned op = insn & 0xff, rd = insn >> 8 & 15, rs = insn >> 12 & 15;
        int64_t imm = (int16_t)(insn >> 16);
        int rc = 0;
        switch (op) {
        case HALT: return 0;
        case LI: v->r[rd] = (uint64_t)imm; break;
        case LD: rc = softmm_cpu_read_uint(v->cpu, v->r[rs], 8, &v->r[rd], f); break;
        case ST: rc = softmm_cpu_write_uint(v->cpu, v->r[rd], 8, v->r[rs], f); break;
        case ADD: v->r[rd] += v->r[rs]; break;
        case ADDI: v->r[rd] += (uint64_t)imm; break;
        case BNZ: if (v->r[rd] != 0) v->pc += (uint64_t)(imm * 4) - 4; break;
        case JR: v->pc = v->r[rd] - 4; break;
        default: fprintf(stderr, "illegal instruction %#x\n", insn); exit(1);
        }
        while (rc == SOFTMM_FAULTED && f->signo == 0 && f->code == SOFTMM_EVENT_WRITE_WATCH) {
            uint64_t written = f->addr & ~4095ull;
            printf("self-modifying code: store of %u bytes at %#llx, translation of %#llx dropped\n", f->size,
                   (unsigned long long)f->addr, (unsigned long long)written);
            if (tc->page == written)
                tc->page = 0;
            CHECK(softmm_mm_write_unwatch(mm, written, 4096, SOFTMM_WATCH_NOTIFY));
            /* Retry the store now, before anything is translated again. */
            rc = softmm_cpu_write_uint(v->cpu, v->r[rd], 8, v->r[rs], f);
        }
        if (rc != 0)
            return rc;
        v->pc += 4;
    }
}

static const char *access_name(const softmm_fault *f) {
    return f->access == SOFTMM_ACCESS_WRITE ? "write" : f->access == SOFTMM_ACCESS_FETCH ? "fetch" : "read";
}

/* The release callback of host memory mapped into the guest: softmm
 * calls it once no CPU can reach the memory any more. */
static void on_release(void *ctx) { *(int *)ctx += 1; }

static const char *code_name(const softmm_fault *f) {
    if (f->signo == SIGSEGV)
        return f->code == 1 ? "SEGV_MAPERR" : f->code == 2 ? "SEGV_ACCERR" : "SI_KERNEL";
    return f->code == 1 ? "BUS_ADRALN" : "BUS_ADRERR";
}

/* A UART for the guest: a store to its data register (offset 0) prints a
 * character, a load of its status register (offset 8) says how many it
 * has printed. Its callbacks run outside any access section: they could
 * block on host I/O without holding up another guest thread's munmap. */
struct uart {
    char out[32];
    unsigned n;
    unsigned released;
};

static uint64_t uart_read(void *opaque, uint64_t offset, uint32_t size) {
    struct uart *u = opaque;
    (void)size;
    return offset == 8 ? u->n : 0;
}

static void uart_write(void *opaque, uint64_t offset, uint32_t size, uint64_t value) {
    struct uart *u = opaque;
    (void)size;
    if (offset == 0 && u->n + 1 < sizeof u->out)
        u->out[u->n++] = (char)value;
}

static void uart_release(void *opaque) {
    ((struct uart *)opaque)->released = 1;
}

int main(void) {
    softmm_phys *phys;
    softmm_mm *mm;
    CHECK(softmm_phys_new(4 << 20, &phys));
    CHECK(softmm_mm_new(phys, &mm));

    /* The loader: text written while writable, then read+exec. */
    const uint32_t program[] = {
        INSN(LI, 3, 0, 10),   /* r3 = 10 */
        INSN(LI, 4, 0, 0),    /* r4 = 0 */
        INSN(ADD, 4, 3, 0),   /* loop: r4 += r3 */
        INSN(ADDI, 3, 0, -1), /* r3 -= 1 */
        INSN(BNZ, 3, 0, -2),  /* until r3 == 0 */
        INSN(ST, 1, 4, 0),    /* data[0] = r4 */
        INSN(ST, 2, 4, 0),    /* text[0] = r4: SEGV_ACCERR */
        INSN(LD, 5, 6, 0),    /* r5 = *hole: SEGV_MAPERR */
        INSN(JR, 1, 0, 0),    /* jump into data: SEGV_ACCERR on the fetch */
    };
    long long text = softmm_mmap(mm, 0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, NULL, 0);
    long long data = softmm_mmap(mm, 0, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, NULL, 0);
    long long stack = softmm_mmap(mm, 0, 16 * 4096, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_GROWSDOWN, NULL, 0);
    CHECK(text);
    CHECK(data);
    CHECK(stack);
    CHECK(softmm_munmap(mm, (uint64_t)data + 4096, 4096)); /* the hole */
    CHECK(softmm_mm_set_start_stack(mm, (uint64_t)stack + 16 * 4096 - 64));

    struct vcpu v = {0};
    CHECK(softmm_cpu_new(mm, &v.cpu));
    softmm_fault f;
    if (softmm_cpu_write(v.cpu, (uint64_t)text, program, sizeof program, &f) != 0)
        return 1;
    CHECK(softmm_mprotect(mm, (uint64_t)text, 4096, PROT_READ | PROT_EXEC));

    v.pc = (uint64_t)text;
    v.r[1] = (uint64_t)data;
    v.r[2] = (uint64_t)text;
    v.r[6] = (uint64_t)data + 4096;
    for (;;) {
        int rc = run(&v, &f);
        CHECK(rc);
        if (rc == 0) {
            printf("guest halted\n");
            break;
        }
        printf("guest signal %d %s at %#llx, pc %#llx, %s of %u bytes\n", f.signo, code_name(&f),
               (unsigned long long)f.addr, (unsigned long long)v.pc, access_name(&f), f.size);
        if (f.addr == v.pc) {
            printf("guest killed: fetch from a non-executable page\n");
            break;
        }
        v.pc += 4; /* the guest's handler skips the faulting instruction */
    }

    uint64_t sum;
    CHECK(softmm_cpu_read_uint(v.cpu, (uint64_t)data, 8, &sum, &f));
    printf("sum = %llu\n", (unsigned long long)sum);

    /* A debugger's watchpoint on the 8 bytes at data + 64, for stores:
     * each store the guest makes there stops it before the store, with
     * the access in the fault; the debugger reports it and resumes the
     * guest past it. Loads of those bytes, and stores elsewhere, run. */
    const uint32_t watched[] = {
        INSN(LI, 3, 0, 5),   INSN(ST, 1, 3, 0), /* [r1] = 5: stops */
        INSN(ADDI, 3, 0, 1), INSN(ST, 2, 3, 0), /* [r2] = 6: runs */
        INSN(LD, 4, 1, 0),   INSN(ST, 1, 3, 0), /* r4 = [r1]; [r1] = 6: stops */
        INSN(HALT, 0, 0, 0),
    };
    long long wtext = softmm_mmap(mm, 0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, NULL, 0);
    CHECK(wtext);
    if (softmm_cpu_write(v.cpu, (uint64_t)wtext, watched, sizeof watched, &f) != 0)
        return 1;
    CHECK(softmm_mprotect(mm, (uint64_t)wtext, 4096, PROT_READ | PROT_EXEC));
    CHECK(softmm_mm_watchpoint_insert(mm, (uint64_t)data + 64, 8, SOFTMM_ACCESS_WRITE));
    struct vcpu vw = {.cpu = v.cpu, .pc = (uint64_t)wtext};
    vw.r[1] = (uint64_t)data + 64;
    vw.r[2] = (uint64_t)data + 72;
    int wrc;
    while ((wrc = run(&vw, &f)) == SOFTMM_FAULTED && f.signo == 0 && f.code == SOFTMM_EVENT_WATCHPOINT) {
        printf("watchpoint: %s of %u bytes at %#llx, pc %#llx\n", access_name(&f), f.size,
               (unsigned long long)(f.access_addr - (uint64_t)data), (unsigned long long)(vw.pc - (uint64_t)wtext));
        CHECK(softmm_cpu_pass_watchpoint(v.cpu)); /* the same instruction runs again, past it */
    }
    CHECK(wrc);
    uint64_t w64;
    CHECK(softmm_cpu_read_uint(v.cpu, (uint64_t)data + 64, 8, &w64, &f));
    printf("watched: r4 = %llu, [data + 64] = %llu\n", (unsigned long long)vw.r[4], (unsigned long long)w64);
    CHECK(softmm_mm_watchpoint_remove(mm, (uint64_t)data + 64, 8, SOFTMM_ACCESS_WRITE));
    CHECK(softmm_munmap(mm, (uint64_t)wtext, 4096));

    /* Self-modifying code, and a dirty-page snapshot. Three pages, rwx:
     * code, then the new code as data, then data. The guest stores a
     * value to page 2, loads the new code from page 1, writes it over
     * its own code at page 0 + 16, and jumps there: the new code (LI r5,
     * 7; HALT) must run, not the stale translation (LI r5, 99). */
    const uint32_t smc[] = {
        INSN(ST, 6, 3, 0),   /* [r6] = r3 (page 2) */
        INSN(LD, 4, 1, 0),   /* r4 = the new code */
        INSN(ST, 2, 4, 0),   /* [r2] = r4: over instructions 4 and 5 */
        INSN(JR, 2, 0, 0),   /* jump to them */
        INSN(LI, 5, 0, 99),  /* replaced by LI r5, 7 */
        INSN(HALT, 0, 0, 0), /* replaced by HALT */
    };
    const uint32_t patch[] = {INSN(LI, 5, 0, 7), INSN(HALT, 0, 0, 0)};
    long long g = softmm_mmap(mm, 0, 3 * 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, NULL, 0);
    CHECK(g);
    if (softmm_cpu_write(v.cpu, (uint64_t)g, smc, sizeof smc, &f) != 0 ||
        softmm_cpu_write(v.cpu, (uint64_t)g + 4096, patch, sizeof patch, &f) != 0)
        return 1;
    /* Log the three pages from here on: the loader's stores are before. */
    uint64_t log;
    CHECK(softmm_mm_write_watch(mm, (uint64_t)g, 3 * 4096, SOFTMM_WATCH_LOG));
    struct tcache tc = {0};
    struct vcpu v2 = {.cpu = v.cpu, .pc = (uint64_t)g};
    v2.r[1] = (uint64_t)g + 4096;
    v2.r[2] = (uint64_t)g + 16;
    v2.r[3] = 42;
    v2.r[6] = (uint64_t)g + 2 * 4096;
    CHECK(run_translated(mm, &v2, &tc, &f));
    printf("smc: r5 = %llu after %u translations\n", (unsigned long long)v2.r[5], tc.translations);
    CHECK(softmm_mm_get_dirty_log(mm, (uint64_t)g, 3 * 4096, &log, 1, 1));
    printf("dirty pages:");
    unsigned char snapshot[3][4096];
    unsigned copied = 0;
    for (unsigned i = 0; i < 3; i++) {
        if (!(log >> i & 1))
            continue;
        printf(" %u", i);
        /* Copied after the call: a store under way has landed. */
        CHECK(softmm_cpu_read(v.cpu, (uint64_t)g + i * 4096ull, snapshot[copied++], 4096, &f));
    }
    printf("\nsnapshot: %u pages, page 2 holds %u\n", copied, snapshot[copied - 1][0]);
    CHECK(softmm_mm_write_unwatch(mm, (uint64_t)g, 3 * 4096, SOFTMM_WATCH_NOTIFY | SOFTMM_WATCH_LOG));
    CHECK(softmm_munmap(mm, (uint64_t)g, 3 * 4096));

    /* Host memory in the guest (unicorn's uc_mem_map_ptr): two pages the
     * host owns, say a framebuffer. A guest store lands in them, a host
     * store is seen by the guest's next load (even through a translation
     * the CPU cached), and the release callback runs at the munmap. */
    static _Alignas(4096) uint32_t fb[2 * 1024];
    static int released;
    long long h = softmm_mmap_host(mm, 0, sizeof fb, PROT_READ | PROT_WRITE, 0, fb, on_release, &released);
    CHECK(h);
    uint64_t guest_sees;
    CHECK(softmm_cpu_read_uint(v.cpu, (uint64_t)h, 4, &guest_sees, &f));
    CHECK(softmm_cpu_write_uint(v.cpu, (uint64_t)h + 4096, 4, 0xc0ffee, &f));
    unsigned host_sees = __atomic_load_n(&fb[1024], __ATOMIC_SEQ_CST);
    __atomic_store_n(&fb[0], 7, __ATOMIC_SEQ_CST);
    CHECK(softmm_cpu_read_uint(v.cpu, (uint64_t)h, 4, &guest_sees, &f));
    int before = released;
    CHECK(softmm_munmap(mm, (uint64_t)h, sizeof fb));
    printf("host memory: host sees %#x, guest sees %llu, released %d then %d\n", host_sees,
           (unsigned long long)guest_sees, before, released);
    /* MMIO: the UART's registers mapped into the guest. Its loads and
     * stores take the same interpreter path (the inline TLB helpers miss,
     * and the library calls the device instead of touching a page). */
    static struct uart uart;
    const softmm_mmio_ops uart_ops = {.read = uart_read, .write = uart_write, .release = uart_release};
    long long io = softmm_mmio_map(mm, 0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, &uart_ops, &uart);
    CHECK(io);
    const uint32_t hello[] = {
        INSN(LI, 3, 0, 'h'), INSN(ST, 1, 3, 0), /* data register = 'h' */
        INSN(LI, 3, 0, 'i'), INSN(ST, 1, 3, 0), /* data register = 'i' */
        INSN(LD, 4, 2, 0),                      /* r4 = status */
        INSN(HALT, 0, 0, 0),
    };
    long long htext = softmm_mmap(mm, 0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, NULL, 0);
    CHECK(htext);
    if (softmm_cpu_write(v.cpu, (uint64_t)htext, hello, sizeof hello, &f) != 0)
        return 1;
    CHECK(softmm_mprotect(mm, (uint64_t)htext, 4096, PROT_READ | PROT_EXEC));
    struct vcpu vu = {.cpu = v.cpu, .pc = (uint64_t)htext};
    vu.r[1] = (uint64_t)io;
    vu.r[2] = (uint64_t)io + 8;
    CHECK(run(&vu, &f));
    printf("mmio: uart printed \"%s\", status %llu\n", uart.out, (unsigned long long)vu.r[4]);
    CHECK(softmm_munmap(mm, (uint64_t)htext, 4096));
    CHECK(softmm_munmap(mm, (uint64_t)io, 4096));
    printf("mmio: released %u\n", uart.released); /* with the last mapping */

    /* fork: the child's CPU (a second one on this thread) writes its copy. */
    softmm_mm *child;
    softmm_cpu *ccpu;
    CHECK(softmm_mm_fork(mm, &child));
    CHECK(softmm_cpu_new(child, &ccpu));
    CHECK(softmm_cpu_write_uint(ccpu, (uint64_t)data, 8, 99, &f));
    uint64_t in_parent, in_child;
    CHECK(softmm_cpu_read_uint(v.cpu, (uint64_t)data, 8, &in_parent, &f));
    CHECK(softmm_cpu_read_uint(ccpu, (uint64_t)data, 8, &in_child, &f));
    printf("after fork: parent %llu, child %llu\n", (unsigned long long)in_parent, (unsigned long long)in_child);

    /* The regions, as /proc/pid/maps lines, from the structured call:
     * ask for the count, then fill an array that size (a mapping made
     * between the two calls would make the second -ERANGE: call again). */
    size_t count = 0;
    CHECK(softmm_mm_regions(mm, NULL, sizeof(softmm_region), &count));
    softmm_region *regions = calloc(count, sizeof *regions);
    if (!regions)
        return 1;
    CHECK(softmm_mm_regions(mm, regions, sizeof *regions, &count));
    for (size_t i = 0; i < count; i++) {
        const softmm_region *r = &regions[i];
        printf("%08llx-%08llx %c%c%c%c %08llx %5llu KiB resident %s\n", (unsigned long long)r->start,
               (unsigned long long)r->end, r->prot & PROT_READ ? 'r' : '-', r->prot & PROT_WRITE ? 'w' : '-',
               r->prot & PROT_EXEC ? 'x' : '-', r->flags & MAP_SHARED ? 's' : 'p', (unsigned long long)r->offset,
               (unsigned long long)(r->rss >> 10), r->name);
    }
    free(regions);

    /* The counters an embedder watches: faults and TLB misses of a CPU,
     * shootdowns of the address space. */
    softmm_cpu_stats cs = {.size = sizeof cs};
    softmm_mm_stats ms = {.size = sizeof ms};
    CHECK(softmm_cpu_get_stats(v.cpu, &cs));
    CHECK(softmm_mm_get_stats(mm, &ms));
    printf("cpu: %llu faults, %llu TLB misses; mm: %llu VMAs, %llu resident pages, %llu TLB shootdowns\n",
           (unsigned long long)cs.faults, (unsigned long long)cs.tlb_misses, (unsigned long long)ms.map_count,
           (unsigned long long)ms.rss_pages, (unsigned long long)ms.tlb_flushes);

    CHECK(softmm_cpu_free(ccpu));
    CHECK(softmm_cpu_free(v.cpu));
    softmm_mm_free(child);
    softmm_mm_free(mm);
    softmm_phys_stats s;
    CHECK(softmm_phys_get_stats(phys, &s));
    printf("leaked: %llu frames, %llu page tables, %llu VMAs\n", (unsigned long long)s.frames_used,
           (unsigned long long)s.page_tables, (unsigned long long)s.vmas);
    softmm_phys_free(phys);
    return 0;
}
