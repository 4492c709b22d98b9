/* The write log's memory-write hook (emu/hotpath/write_log.py says what it records and why).
 *
 * One permanent hook over the whole address space, installed only for a verified run; it returns
 * at once unless a transaction is open (log->open), so no hook is added or moved per hit.
 */
#include <string.h>

#include "verify.h"

static struct log_entry *next_entry(struct write_log *log)
{
    return log->count < log->capacity ? &log->entries[log->count] : NULL;
}

static void fill_entry(uc_engine *uc, struct write_log *log, struct log_entry *entry, uint64_t address, int size,
                       int64_t value)
{
    entry->address = address;
    entry->size = (uint64_t)size;
    entry->value = value;
    entry->pc = 0;
    AS_FN(uc_reg_read_fn, log->reg_read)(uc, (int)log->rip_id, &entry->pc);
}

/* A store outside the red zone and the scratch below it: logged with the bytes it overwrites (it
 * has not landed yet), and counted. */
static void log_outside(uc_engine *uc, struct write_log *log, uint64_t address, int size, int64_t value)
{
    log->outside++;
    struct log_entry *entry = next_entry(log);
    if (entry != NULL) {
        entry->old = 0;
        size_t n = size > 0 && size <= (int)sizeof entry->old ? (size_t)size : sizeof entry->old;
        AS_FN(uc_mem_read_fn, log->mem_read)(uc, address, &entry->old, n);
        fill_entry(uc, log, entry, address, size, value);
    }
    log->count++;
}

/* A store into the red zone: the red zone is copied before the first one lands. */
static void log_redzone(uc_engine *uc, struct write_log *log, uint64_t address, int size, int64_t value)
{
    if (!log->taken) {
        log->taken = 1;
        log->status = (uint64_t)AS_FN(uc_mem_read_fn, log->mem_read)(uc, log->base, log->snapshot, log->length);
    }
    struct log_entry *entry = next_entry(log);
    if (entry != NULL) {
        entry->old = 0;
        fill_entry(uc, log, entry, address, size, value);
    }
    log->count++;
}

static int writelog_hook(uc_engine *uc, int type, uint64_t address, int size, int64_t value, void *user_data)
{
    struct write_log *log = user_data;
    if (!log->open)
        return 1;
    uint64_t base = log->base, end = address + (uint64_t)size;
    if (end < address) { /* past the top of the address space: outside (emu/hotpath/write_log.py's classify) */
        log_outside(uc, log, address, size, value);
    } else if (end <= base) { /* below the red zone: the scratch, or outside */
        if (base < log->scratch || address >= base - log->scratch)
            return 1;
        log_outside(uc, log, address, size, value);
    } else if (address >= base + log->length) {
        log_outside(uc, log, address, size, value);
    } else {
        log_redzone(uc, log, address, size, value);
    }
    return 1;
}

int hotpath_add_writelog(PyObject *module)
{
    hook_mem_fn hook = writelog_hook;
    return hotpath_add_address(module, "writelog_hook", (void *)hook);
}
