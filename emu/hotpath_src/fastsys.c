/* Counting-only probe hits without entering Python: the one syscall hook and the one interrupt hook.
 *
 * A FastSys object sits in front of the Python syscall and interrupt callbacks (emu/cpu/hooks.py). For a hit
 * on a probe whose every consumer only counts, with nothing in Python watching (emu/kernel/uprobes/
 * fastpath.py decides, and opens the gate), it does what the kernel's fast path leaves observable
 * and returns; anything else goes to the Python callback unchanged, by its C address.
 *
 * - sys_uprobe (spec 2.1): when no consumer changes pt_regs, the round trip writes back what it read.
 *   What remains is the hit, the saved words read from the stack, and the design's exit: SYSRET into
 *   the trampoline (rax 0, rcx = ip, r11 = flags; steps 13-16), or straight to the instruction after
 *   the site with the saved registers and rsp restored (IRET, or SYSRET, which also sets rcx and r11).
 * - INT3 on a probed NOP that is not optimized (spec 4.2, branch_xol_ops with offs 0): ip += length.
 * - uretprobes that only count: the entry's prepare_uretprobe (spec 5.1: hijack the return address,
 *   push a return instance, here on a stack of this object's) and sys_uretprobe (spec 2.2 with 5.2)
 *   for the instances pushed here. Python's own pending instances lie below them: the ones here move
 *   to Python (take_returns) before Python handles anything, and whatever needs Python's (a chain or
 *   a clean-up reaching them) is Python's to do.
 *
 * - With the verifiers on (emu/hotpath/edges.py), a hit the site hook opened a transaction for is
 *   still handled here when the verdict can be reached in C: a NOP-class site of a counting-only probe,
 *   no record of the transaction in Python. The front then does what the tracker's kernel-side
 *   observers would: it notes the hit's path and exit in the control block (Python adopts them if it
 *   ever judges the hit), and either arms the transaction for the trampoline's ret (the 'trampoline'
 *   exit, once Python has found that ret) or settles it at once as the kernel returns (IRET, SYSRET,
 *   INT3). A hit that does not settle goes to Python's after-syscall or after-interrupt observers,
 *   which judge it as if Python had handled it.
 *
 * - Every kernel entry, handled here or in Python, is first charged to the process's instruction counter
 *   when Python has given it one (set_clock: the virtual clock counts the kernel's time, icount.c).
 *
 * The tables (probe addresses, each consumer's counters, trampoline pages, slots) are Python's to
 * keep: any change anywhere bumps one generation count (a word Python owns, set_generation), and a
 * FastSys whose tables are of an older generation hands every hit to Python until Python has rebuilt them.
 */
#include "fastsys.h"

#include <string.h>

static const pair *find_pair(const pair *table, Py_ssize_t n, uint64_t key)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (table[mid].key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && table[lo].key == key ? &table[lo] : NULL;
}

static const probe_entry *find_probe(const FastSys *f, uint64_t vaddr)
{
    Py_ssize_t lo = 0, hi = f->probe_count;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (f->probes[mid].vaddr < vaddr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < f->probe_count && f->probes[lo].vaddr == vaddr ? &f->probes[lo] : NULL;
}

static int in_trampoline(const FastSys *f, uint64_t ip)
{
    for (Py_ssize_t i = 0; i < f->page_count; i++)
        if (f->pages[i].key <= ip && ip < f->pages[i].value)
            return 1;
    return 0;
}

static void count_hit(FastSys *f, const probe_entry *probe, int path)
{
    for (uint32_t i = 0; i < probe->count; i++)
        f->counters[probe->first + i][path]++;
}

/* arch_uretprobe_is_alive (spec 5.1): RP_CHECK_CALL is sp < stack, CHAIN_CALL and RET are sp <= stack */
static int alive(uint64_t stack, uint64_t sp, int or_equal)
{
    return or_equal ? sp <= stack : sp < stack;
}

/* prepare_uretprobe (spec 5.1) for a probe whose return handlers only count; 0 (nothing done): Python's */
static int prepare_uretprobe(FastSys *f, const probe_entry *probe, uint64_t vaddr, uint64_t sp)
{
    uint64_t orig;
    if (f->xol == 0 || f->python_depth + (uint64_t)f->return_count >= MAX_URETPROBE_DEPTH)
        return 0; /* get_xol_area, or the nestedness limit's message: Python's */
    if (f->mem_read(f->uc, sp, &orig, 8) != 0)
        return 0;
    int chained = orig == f->xol, kept = f->return_count;
    while (kept > 0 && !alive(f->returns[kept - 1].stack, sp, chained))
        kept--; /* cleanup_return_instances: longjmp'd over, dropped without handlers */
    if (kept == 0 && f->python_depth && !alive(f->python_top_stack, sp, chained))
        return 0; /* the clean-up reaches Python's instances */
    if (chained && kept == 0)
        return 0; /* the real return address is in Python's chain, or the tail call warning */
    if (!chained && f->mem_write(f->uc, sp, &f->xol, 8) != 0)
        return 0;
    f->return_count = kept;
    return_instance *ri = &f->returns[f->return_count++];
    ri->func = vaddr, ri->stack = sp, ri->chained = (uint32_t)chained;
    ri->orig = chained ? f->returns[kept - 1].orig : orig;
    ri->probe = (uint32_t)(probe - f->probes);
    f->stats[ST_COPIED] += chained ? 8 : 16;
    return 1;
}

/* sys_uretprobe (spec 2.2, uprobe_handle_trampoline 5.2) for return instances pushed here, with the
 * 'trampoline' exit; 0: Python must handle it. rip is at the syscall. */
static int fast_uretprobe(FastSys *f, const uint64_t *v)
{
    uint64_t ip = v[REG_IP] + 2, flags = v[REG_FLAGS], sp = v[REG_SP];
    uint64_t words[MAX_SAVED];
    int n = f->ret_saved_count;
    if (f->return_count == 0 || f->xol == 0 || ip != f->xol + f->ret_syscall_return || flags & (FLAGS_TF | FLAGS_RF))
        return 0; /* step 2's SIGILL, Python's instances, or an IRET exit */
    if (f->mem_read(f->uc, sp, words, 8 * (size_t)n) != 0)
        return 0;
    uint64_t after = sp + 8 * (uint64_t)n; /* steps 3-4 */
    int first = f->return_count - 1;
    while (first > 0 && f->returns[first].chained)
        first--; /* the chain: every instance down to the first not chained */
    if (f->returns[first].chained && f->python_depth)
        return 0; /* the chain goes on into Python's instances */
    uint64_t below = first > 0 ? f->returns[first - 1].stack : f->python_top_stack;
    if ((first > 0 || f->python_depth) && !alive(below, after, 1))
        return 0; /* an invalid chain (longjmp): Python drops it and goes on */
    uint64_t orig = f->returns[f->return_count - 1].orig; /* regs->ip: the head's original return address */
    for (int i = f->return_count - 1; i >= first; i--) {
        const probe_entry *probe = &f->probes[f->returns[i].probe];
        f->stats[ST_RET_HITS]++;
        for (uint32_t j = 0; j < probe->ret_count; j++)
            f->counters[probe->ret_first + j][PATH_RETURN]++;
    }
    f->return_count = first;
    /* steps 8-12: the words go back, the last one (ax's slot) now the return address the trampoline's
     * ret pops; SYSRET into the trampoline with rcx = ip, r11 = flags, the other words restored */
    if (f->mem_write(f->uc, sp + 8 * (uint64_t)(n - 1), &orig, 8) != 0)
        return 0; /* not reached: the words were just read there */
    int ids[MAX_SAVED + 2];
    uint64_t values[MAX_SAVED + 2];
    void *ptrs[MAX_SAVED + 2];
    int k = 0;
    for (int i = 0; i < n; i++)
        ids[k] = f->ret_saved_ids[i], values[k++] = words[i];
    ids[k] = f->ids[REG_CX], values[k++] = ip;
    ids[k] = f->ids[REG_R11], values[k++] = flags;
    for (int i = 0; i < k; i++)
        ptrs[i] = &values[i];
    f->reg_write_batch(f->uc, ids, ptrs, k);
    f->stats[ST_URETPROBE_CALLS]++;
    f->stats[ST_COPIED] += 16 * (uint64_t)n;
    f->stats[ST_EXIT_SYSRET]++;
    return 1;
}

/* What the verifiers need of a hit at a probe site: nothing (no transaction open), the front's part of
 * the open one (a NOP-class site, a transaction Python has no record of), or Python. */
enum { WATCH_NONE, WATCH_OPEN, WATCH_PYTHON };

static int watch_of(const FastSys *f, const probe_entry *probe, uint64_t vaddr)
{
    const struct edges *e = f->verifier;
    if (e == NULL || e->state == EDGES_IDLE)
        return WATCH_NONE;
    if (e->state != EDGES_OPEN || e->seq == e->python_seq || e->site != vaddr || probe->nop_next == 0)
        return WATCH_PYTHON;
    return WATCH_OPEN;
}

/* The kernel part of the open transaction's hit is done here: what the tracker's observers would note. */
static void note_kernel_part(FastSys *f, int path, int exit)
{
    struct edges *e = f->verifier;
    e->kernel_seq = e->seq, e->kernel_path = (uint64_t)path, e->kernel_exit = (uint64_t)exit;
}

/* The kernel returns to user mode at rip + rip_advance: the watched hit settles, or Python judges it. */
static void settle_or_judge_syscall(FastSys *f, uc_engine *uc, const probe_entry *probe)
{
    if (!edges_settle_at_return(uc, f->verifier, 2, probe->nop_next) && f->python_after_syscall != NULL)
        f->python_after_syscall(uc, NULL);
}

/* sys_uprobe on the counting-only path; 0: Python must handle this syscall. rip is at the syscall. */
static int fast_uprobe(FastSys *f, const uint64_t *v)
{
    uint64_t ip = v[REG_IP] + 2, flags = v[REG_FLAGS], sp = v[REG_SP], vaddr = 0;
    uint64_t words[MAX_SAVED + 1];
    int count = f->saved_count + (f->by_slot ? 0 : 1); /* + the call's return address (2.1 step 2) */
    if (flags & (FLAGS_TF | FLAGS_RF))
        return 0; /* do_syscall_64 returns by IRET: Python's full path counts that exit */
    if (f->by_slot) {
        const pair *slot = find_pair(f->slots, f->slot_count, ip - f->syscall_return);
        if (slot == NULL)
            return 0;
        vaddr = slot->value;
    } else if (!in_trampoline(f, ip)) {
        return 0; /* step 1: -ENXIO, Python's to say */
    }
    if (f->mem_read(f->uc, sp + f->saved_offset, words, 8 * (size_t)count) != 0)
        return 0; /* step 2: SIGILL, Python's to raise */
    if (!f->by_slot)
        vaddr = words[f->saved_count] - f->branch_end;
    const probe_entry *probe = find_probe(f, vaddr);
    if (probe == NULL)
        return 0;
    /* pt_regs as consumers see them: rsp past the trampoline's frame, at the return address (5.1) */
    uint64_t regs_sp = sp + f->saved_offset + 8 * (uint64_t)count + f->sp_skip;
    int watch = watch_of(f, probe, vaddr);
    if (watch == WATCH_PYTHON || (watch == WATCH_OPEN && f->exit_kind == EXIT_TRAMPOLINE && probe->arm_ret == 0))
        return 0;
    if (watch == WATCH_OPEN && probe->returns && regs_sp != STATE_RSP(f->verifier->start))
        return 0; /* the return-address hijack lands elsewhere than the interrupted rsp: the memory check's */
    if (probe->returns && !prepare_uretprobe(f, probe, vaddr, regs_sp))
        return 0;
    count_hit(f, probe, f->path);
    if (watch == WATCH_OPEN)
        note_kernel_part(f, f->path, f->exit_kind == EXIT_IRET ? EDGES_EXIT_IRET : EDGES_EXIT_SYSRET);
    f->stats[ST_UPROBE_CALLS]++;
    if (!f->by_slot)
        f->stats[ST_MMAP_LOCKS]++; /* the trampoline's VMA lookup (Uprobes.in_trampoline) */
    if (f->exit_kind == EXIT_TRAMPOLINE) {
        /* steps 10-16: the words go back unchanged, SYSRET into the trampoline, whose pops restore them */
        int ids[3] = {f->ids[REG_AX], f->ids[REG_CX], f->ids[REG_R11]};
        uint64_t values[3] = {0, ip, flags};
        void *ptrs[3] = {&values[0], &values[1], &values[2]};
        f->stats[ST_COPIED] += 16 * (uint64_t)count;
        f->stats[ST_EXIT_SYSRET]++;
        f->reg_write_batch(f->uc, ids, ptrs, 3);
        if (watch == WATCH_OPEN)
            edges_arm(f->verifier, probe->arm_ret, probe->arm_popped, probe->nop_next);
        return 1;
    }
    /* IRET or SYSRET straight past the site: syscall's own rcx and r11 first, then the restored words,
     * rsp, rip (Unicorn adds 2 once this hook returns), and for SYSRET its rcx and r11 last */
    int ids[MAX_SAVED + 6];
    uint64_t values[MAX_SAVED + 6];
    void *ptrs[MAX_SAVED + 6];
    uint64_t next_ip = vaddr + f->patch_length;
    int n = 0;
    ids[n] = f->ids[REG_CX], values[n++] = ip;
    ids[n] = f->ids[REG_R11], values[n++] = flags;
    for (int i = 0; i < f->saved_count; i++)
        ids[n] = f->saved_ids[i], values[n++] = words[i];
    ids[n] = f->ids[REG_SP], values[n++] = regs_sp;
    ids[n] = f->ids[REG_IP], values[n++] = next_ip - 2;
    if (f->exit_kind == EXIT_SYSRET) {
        ids[n] = f->ids[REG_CX], values[n++] = next_ip;
        ids[n] = f->ids[REG_R11], values[n++] = flags;
    }
    for (int i = 0; i < n; i++)
        ptrs[i] = &values[i];
    f->stats[ST_COPIED] += 8 * (uint64_t)count;
    f->stats[f->exit_kind == EXIT_IRET ? ST_EXIT_IRET : ST_EXIT_SYSRET]++;
    f->reg_write_batch(f->uc, ids, ptrs, n);
    if (watch == WATCH_OPEN)
        settle_or_judge_syscall(f, f->uc, probe);
    return 1;
}

static int usable(const FastSys *f)
{
    return f->open && f->latest && f->generation == *f->latest;
}

void fastsys_on_syscall(uc_engine *uc, void *user_data)
{
    FastSys *f = user_data;
    if (f->clock != NULL)
        icount_charge(f->clock, uc);
    if (usable(f) && (f->handler_nr >= 0 || f->ret_nr >= 0)) {
        uint64_t v[4];
        int ids[4] = {f->ids[REG_AX], f->ids[REG_IP], f->ids[REG_FLAGS], f->ids[REG_SP]};
        void *ptrs[4] = {&v[0], &v[1], &v[2], &v[3]};
        f->reg_read_batch(uc, ids, ptrs, 4);
        if (f->handler_nr >= 0 && v[REG_AX] == (uint64_t)f->handler_nr && fast_uprobe(f, v))
            return;
        if (f->ret_nr >= 0 && v[REG_AX] == (uint64_t)f->ret_nr && fast_uretprobe(f, v))
            return;
    }
    f->python_syscall(uc, NULL);
}

void fastsys_on_interrupt(uc_engine *uc, uint32_t intno, void *user_data)
{
    FastSys *f = user_data;
    if (f->clock != NULL)
        icount_charge(f->clock, uc);
    if (intno == 3 && usable(f)) {
        uint64_t rip;
        f->reg_read(uc, f->ids[REG_IP], &rip);
        const probe_entry *probe = find_probe(f, rip - 1); /* #BP reports the address after the int3 */
        int watch = probe != NULL && probe->int3_length ? watch_of(f, probe, rip - 1) : WATCH_PYTHON;
        if (watch != WATCH_PYTHON) {
            count_hit(f, probe, PATH_INT3);
            f->stats[ST_TRAPS]++;
            f->stats[ST_EMULATED]++;
            rip = rip - 1 + probe->int3_length; /* spec 4.2: a NOP's emulation is ip += length */
            /* the batch call, as Cpu.resume_at says: uc_reg_write from an interrupt hook would leave
             * Unicorn reading stale pcs in memory hooks and faults for the rest of the run */
            int rip_id = f->ids[REG_IP];
            void *rip_ptr = &rip;
            f->reg_write_batch(uc, &rip_id, &rip_ptr, 1);
            if (watch == WATCH_OPEN) {
                note_kernel_part(f, PATH_INT3, EDGES_EXIT_NONE);
                if (!edges_settle_at_return(uc, f->verifier, 0, probe->nop_next) && f->python_after_interrupt != NULL)
                    f->python_after_interrupt(uc, intno, NULL);
            }
            return;
        }
    }
    f->python_interrupt(uc, intno, NULL);
}
