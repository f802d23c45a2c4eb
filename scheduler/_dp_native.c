/* The length batcher's DP (dp_batcher._dp_loop) over a dense cost table, compiled.

Why C: the DP looks at every group of up to max_batch_size sorted items ending at every item,
256 x 64 = 16k table lookups for a full window. Python spends ~1.7 ms on that and numpy,
which needs a whole-array pass per step of the search, ~0.2 ms; a plain loop in C takes a few
tens of microseconds, and the decision runs once per batch on the engine thread.

The loop is the Python loop line by line, on the same doubles (the table is the numpy copy of
the cost model's table), so the plans are the Python loop's plans, ties included: candidates
are visited from the smallest group up and only a strictly smaller cost replaces the best.
Build with -ffp-contract=off: a fused multiply-add would round the latency objective's
weight * cost + best differently from Python.

solve(items, seq_counts, token_counts, latency, table, packed, max_seqs, max_tokens)
    items          one int per item (its longest sequence), or one sequence of ints per item
                   (a request's sequence lengths: its longest, count and sum are taken here,
                   which saves the engine thread three Python passes over the queue)
    seq_counts     None (one sequence each, or taken from items) or one int per item
    token_counts   None (the lengths, or taken from items) or one int per item
    latency        False: minimise the total cost; True: weight a group by the sequences
                   still waiting when it starts (dp_batcher's "latency" objective)
    table          2-D C-contiguous float64 buffer: table[sequences][column]
    packed         True: column = tokens // sequences; False: the group's longest length
-> (order, cuts, stats): the items' indices sorted by length (stable), the batches as
   (start, end) positions in that order, shortest first, and each batch's
   (sequences, longest, tokens).
Raises IndexError when the table has too few rows (sequences) or columns (lengths) for the
items: the caller grows it and asks again.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int check_range(long long v, const char *what, Py_ssize_t i)
{
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] = %lld is out of range", what, i, v);
        return -1;
    }
    return 0;
}

/* Reads n non-negative ints (Python ints or anything with __index__) into out. */
static int read_ints(PyObject *seq, Py_ssize_t n, int64_t *out, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd items, items has %zd", what, PySequence_Fast_GET_SIZE(fast), n);
        Py_DECREF(fast);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(items[i]);
        if (check_range(v, what, i) < 0) {
            Py_DECREF(fast);
            return -1;
        }
        out[i] = v;
    }
    Py_DECREF(fast);
    return 0;
}

/* Item i is an int (one sequence of that length) or a non-empty sequence of ints (a request's
   sequences): its longest, count and total. Returns 1 if it was a sequence, 0 if an int. */
static int read_item(PyObject *item, Py_ssize_t i, int64_t *longest, int64_t *count, int64_t *total)
{
    if (PyIndex_Check(item)) {
        long long v = PyLong_AsLongLong(item);
        if (check_range(v, "items", i) < 0)
            return -1;
        *longest = *total = v;
        *count = 1;
        return 0;
    }
    PyObject *fast = PySequence_Fast(item, "items must be ints or sequences of ints");
    if (fast == NULL)
        return -1;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(fast);
    if (m == 0) {
        PyErr_Format(PyExc_ValueError, "items[%zd] is empty: a request holds one sequence at least", i);
        Py_DECREF(fast);
        return -1;
    }
    PyObject **lengths = PySequence_Fast_ITEMS(fast);
    int64_t most = 0, sum = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        long long v = PyLong_AsLongLong(lengths[j]);
        if (check_range(v, "items", i) < 0) {
            Py_DECREF(fast);
            return -1;
        }
        most = v > most ? v : most;
        sum += v;
    }
    Py_DECREF(fast);
    if (sum > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "items[%zd] holds too many tokens", i);
        return -1;
    }
    *longest = most;
    *count = m;
    *total = sum;
    return 1;
}

/* Sorts keys (length << 32 | index) ascending: by length, then by index, which is a stable
   sort by length like Python's sorted(). Bottom-up merge sort through a scratch array. */
static void sort_keys(uint64_t *keys, uint64_t *scratch, Py_ssize_t n)
{
    uint64_t *src = keys, *dst = scratch;
    for (Py_ssize_t width = 1; width < n; width *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * width) {
            Py_ssize_t mid = lo + width < n ? lo + width : n;
            Py_ssize_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            Py_ssize_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi)
                dst[k++] = src[b] < src[a] ? src[b++] : src[a++];
            while (a < mid)
                dst[k++] = src[a++];
            while (b < hi)
                dst[k++] = src[b++];
        }
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != keys)
        memcpy(keys, src, (size_t)n * sizeof(uint64_t));
}

typedef struct {
    Py_ssize_t n;
    int64_t *lengths, *seqs, *toks;  /* per item, in the caller's order */
    int64_t *order, *sorted_len;     /* per sorted position */
    int64_t *pre_seq, *pre_tok;      /* prefix sums over the sorted items, n + 1 */
    int64_t *start;                  /* start[i]: where the best plan for sorted[0:i] cuts last */
    double *best;                    /* best[i]: its cost */
    uint64_t *keys, *scratch;
} Work;

static void free_work(Work *w)
{
    free(w->lengths); free(w->seqs); free(w->toks); free(w->order); free(w->sorted_len);
    free(w->pre_seq); free(w->pre_tok); free(w->start); free(w->best); free(w->keys); free(w->scratch);
}

static int alloc_work(Work *w, Py_ssize_t n)
{
    memset(w, 0, sizeof(*w));
    w->n = n;
    size_t items = (size_t)n + 1;
    w->lengths = malloc(items * sizeof(int64_t));
    w->seqs = malloc(items * sizeof(int64_t));
    w->toks = malloc(items * sizeof(int64_t));
    w->order = malloc(items * sizeof(int64_t));
    w->sorted_len = malloc(items * sizeof(int64_t));
    w->pre_seq = malloc(items * sizeof(int64_t));
    w->pre_tok = malloc(items * sizeof(int64_t));
    w->start = malloc(items * sizeof(int64_t));
    w->best = malloc(items * sizeof(double));
    w->keys = malloc(items * sizeof(uint64_t));
    w->scratch = malloc(items * sizeof(uint64_t));
    if (!w->lengths || !w->seqs || !w->toks || !w->order || !w->sorted_len || !w->pre_seq || !w->pre_tok ||
        !w->start || !w->best || !w->keys || !w->scratch) {
        free_work(w);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The DP proper: best[i] = min over groups sorted[a:i] within the caps of
   best[a] + (weight[a] *) table[sequences][column]. Same visiting order and comparison as
   dp_batcher._dp_loop; a lone item always runs, even over the caps. The table has a row for
   every group's sequence count (solve checked); the column is clipped for token counts that
   exceed count * longest (the caller's numbers, never the engine's). */
static void run_dp(Work *w, const double *table, Py_ssize_t width, int latency, int packed,
                   int64_t max_seqs, int64_t max_tokens)
{
    const Py_ssize_t n = w->n;
    const int64_t total_seqs = w->pre_seq[n];
    w->best[0] = 0.0;
    w->start[0] = 0;
    for (Py_ssize_t i = 1; i <= n; i++) {
        const int64_t seq_i = w->pre_seq[i], tok_i = w->pre_tok[i], longest = w->sorted_len[i - 1];
        double best_i = INFINITY;
        int64_t start_i = 0;
        for (Py_ssize_t a = i - 1; a >= 0; a--) {  /* the group a..i-1 only grows as a moves left */
            const int64_t n_seq = seq_i - w->pre_seq[a], n_tok = tok_i - w->pre_tok[a];
            if (a < i - 1 && (n_seq > max_seqs || n_tok > max_tokens))
                break;
            /* 32-bit division where it fits: several times faster than 64-bit on x86 */
            int64_t column = !packed ? longest
                             : n_tok <= UINT32_MAX ? (int64_t)((uint32_t)n_tok / (uint32_t)n_seq)
                                                   : n_tok / n_seq;
            if (column >= width)
                column = width - 1;
            double c = table[n_seq * width + column];
            c = w->best[a] + (latency ? (double)(total_seqs - w->pre_seq[a]) * c : c);
            if (c < best_i) {
                best_i = c;
                start_i = a;
            }
        }
        w->best[i] = best_i;
        w->start[i] = start_i;
    }
}

/* (order, cuts, stats) from the solved DP: the backtrack from n, then reversed. */
static PyObject *plan_from(Work *w)
{
    const Py_ssize_t n = w->n;
    Py_ssize_t batches = 0;
    for (Py_ssize_t i = n; i > 0; i = w->start[i])
        batches++;
    PyObject *order = PyList_New(n), *cuts = PyList_New(batches), *stats = PyList_New(batches);
    if (!order || !cuts || !stats)
        goto fail;
    for (Py_ssize_t p = 0; p < n; p++) {
        PyObject *v = PyLong_FromLongLong(w->order[p]);
        if (!v)
            goto fail;
        PyList_SET_ITEM(order, p, v);
    }
    Py_ssize_t b = batches;
    for (Py_ssize_t i = n; i > 0; i = w->start[i]) {
        const int64_t a = w->start[i];
        PyObject *cut = Py_BuildValue("(nn)", (Py_ssize_t)a, i);
        PyObject *stat = Py_BuildValue("(LLL)", (long long)(w->pre_seq[i] - w->pre_seq[a]),
                                       (long long)w->sorted_len[i - 1], (long long)(w->pre_tok[i] - w->pre_tok[a]));
        if (!cut || !stat) {
            Py_XDECREF(cut);
            Py_XDECREF(stat);
            goto fail;
        }
        b--;
        PyList_SET_ITEM(cuts, b, cut);
        PyList_SET_ITEM(stats, b, stat);
    }
    return Py_BuildValue("(NNN)", order, cuts, stats);
fail:
    Py_XDECREF(order);
    Py_XDECREF(cuts);
    Py_XDECREF(stats);
    return NULL;
}

static PyObject *solve(PyObject *self, PyObject *args)
{
    PyObject *items, *seq_counts, *token_counts, *table_obj;
    int latency, packed;
    long long max_seqs, max_tokens;
    if (!PyArg_ParseTuple(args, "OOOpOpLL:solve", &items, &seq_counts, &token_counts, &latency, &table_obj,
                          &packed, &max_seqs, &max_tokens))
        return NULL;
    Py_ssize_t n = PySequence_Length(items);
    if (n < 0)
        return NULL;
    if (n > (Py_ssize_t)INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "too many items");
        return NULL;
    }

    Py_buffer table;
    if (PyObject_GetBuffer(table_obj, &table, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (table.ndim != 2 || table.itemsize != sizeof(double) || strcmp(table.format, "d") != 0 ||
        table.shape[0] < 1 || table.shape[1] < 1) {
        PyErr_SetString(PyExc_TypeError, "table must be a non-empty 2-D C-contiguous float64 array");
        PyBuffer_Release(&table);
        return NULL;
    }

    Work w;
    if (alloc_work(&w, n) < 0) {
        PyBuffer_Release(&table);
        return NULL;
    }
    PyObject *result = NULL;
    PyObject *fast = PySequence_Fast(items, "items must be a sequence");
    if (fast == NULL)
        goto done;
    int any_request = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int kind = read_item(PySequence_Fast_GET_ITEM(fast, i), i, &w.lengths[i], &w.seqs[i], &w.toks[i]);
        if (kind < 0) {
            Py_DECREF(fast);
            goto done;
        }
        any_request |= kind;
    }
    Py_DECREF(fast);
    if (any_request && (seq_counts != Py_None || token_counts != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "items given as requests carry their own counts: pass None for both");
        goto done;
    }
    if (seq_counts != Py_None && read_ints(seq_counts, n, w.seqs, "seq_counts") < 0)
        goto done;
    if (token_counts != Py_None && read_ints(token_counts, n, w.toks, "token_counts") < 0)
        goto done;
    int64_t most_seqs = max_seqs, longest = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (w.seqs[i] == 0) {
            PyErr_Format(PyExc_ValueError, "seq_counts[%zd] is 0: an item holds one sequence at least", i);
            goto done;
        }
        most_seqs = w.seqs[i] > most_seqs ? w.seqs[i] : most_seqs;
        longest = w.lengths[i] > longest ? w.lengths[i] : longest;
        w.keys[i] = ((uint64_t)w.lengths[i] << 32) | (uint64_t)i;
    }
    if (table.shape[0] <= most_seqs || table.shape[1] <= longest) {
        PyErr_Format(PyExc_IndexError, "the cost table has %zd x %zd entries; these items need %lld x %lld",
                     table.shape[0], table.shape[1], (long long)most_seqs + 1, (long long)longest + 1);
        goto done;
    }
    sort_keys(w.keys, w.scratch, n);
    w.pre_seq[0] = w.pre_tok[0] = 0;
    for (Py_ssize_t p = 0; p < n; p++) {
        const int64_t item = (int64_t)(w.keys[p] & 0xffffffffu);
        w.order[p] = item;
        w.sorted_len[p] = w.lengths[item];
        w.pre_seq[p + 1] = w.pre_seq[p] + w.seqs[item];
        w.pre_tok[p + 1] = w.pre_tok[p] + w.toks[item];
    }
    run_dp(&w, (const double *)table.buf, table.shape[1], latency, packed, max_seqs, max_tokens);
    result = plan_from(&w);
done:
    free_work(&w);
    PyBuffer_Release(&table);
    return result;
}

static PyMethodDef methods[] = {
    {"solve", solve, METH_VARARGS, "The length batcher's DP over a dense cost table (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_dp_native", "The length batcher's DP, compiled (scheduler/_dp_native.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__dp_native(void)
{
    return PyModule_Create(&module);
}
