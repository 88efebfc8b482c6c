/*
 * basalt.common._records: the CommitLog's per-record loops, in C.
 *
 * Every record of RocketMQ's layout (see common/record.py for the
 * byte table) is validated field by field, its body CRC computed, and - on the write
 * side - its broker-assigned fields stamped. Python keeps per-batch work
 * (locks, file choice, ConsumeQueue writes); this module keeps the per-record
 * work, and releases the GIL while it walks bytes so the writer, the
 * dispatcher and the event loop overlap on two cores. On the read side,
 * gather() is the pull path's loop over ConsumeQueue units. The SDK uses only
 * the codec (decode_records, encode_batch, slotted); the rest is the engine's,
 * kept in one extension so the layout's constants are defined once in C too.
 *
 * The validation rules are exactly basalt.common.record.check_record's, which stays
 * the readable reference: tests run both on the same (corrupted) bytes and
 * require the same verdict.
 *
 * Buffers: callers pass objects with the buffer protocol (bytes, bytearray,
 * mmap). A held Py_buffer export pins the memory: a bytearray cannot be
 * resized and an mmap cannot be closed while we work with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX, READONLY: the slots of decode_records' objects */
#include <limits.h>
#include <stdint.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#define MESSAGE_MAGIC_CODE 0xDAA320A7u
#define BLANK_MAGIC_CODE 0xCBD43194u
#define BORNHOST_V6_FLAG 0x10
#define STOREHOSTADDRESS_V6_FLAG 0x20
#define TRANSACTION_TYPE_MASK 0xC /* bits 2-3 of SYSFLAG */
#define TRANSACTION_PREPARED_TYPE 0x4
#define TRANSACTION_ROLLBACK_TYPE 0xC
#define PREFIX_SIZE 48 /* TOTALSIZE .. BORNTIMESTAMP */
#define MIN_RECORD_SIZE 91
#define MAX_TOPIC_BYTES 127

/* Outcome of a walk (scan, dispatch): exported as KIND_*, read by
 * store/recovery.py and store/dispatcher.py. */
enum { KIND_MORE = 0, KIND_END = 1, KIND_BLANK = 2, KIND_CORRUPT = 3 };

/* ---- CRC32 (zlib's polynomial), slice-by-8 -------------------------------- */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[t][n] = c;
        }
    }
}

static uint32_t crc32_table(uint32_t crc, const uint8_t *p, size_t len) {
    crc = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= crc;
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
              crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
              crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_CLMUL_PATH 1
static int have_clmul;

/*
 * CRC32 by carry-less multiplication: fold 64 bytes per step, then Barrett
 * reduction (Gopal et al., "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ Instruction", Intel, 2009; the bit-reflected constants of zlib's
 * polynomial 0xEDB88320 from that paper). ~5x the table-driven speed, which
 * matters because every body is CRC'd on append and on recovery.
 * len >= 64 and a multiple of 16; crc is the running (inverted) register.
 */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_clmul(const uint8_t *buf,
                                                                       size_t len, uint32_t crc) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;

    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = k1k2;
    buf += 64;
    len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(buf + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(buf + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(buf + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(buf + 0x30)));
        buf += 64;
        len -= 64;
    }
    /* Fold the four lanes into one. */
    x0 = k3k4;
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    /* 128 -> 64 bits. */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to 32 bits. */
    x0 = poly;
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

/* zlib.crc32(data, crc): the carry-less path for the bulk, tables for the tail. */
static uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t len) {
#ifdef HAVE_CLMUL_PATH
    if (have_clmul && len >= 64) {
        size_t chunk = len & ~(size_t)15;
        crc = ~crc32_clmul(p, chunk, ~crc);
        p += chunk;
        len -= chunk;
    }
#endif
    return crc32_table(crc, p, len);
}

/* crc32_combine (zlib 1.2.12's multmodp/x2nmodp): the CRC of A||B from crc(A),
 * crc(B) and len(B), without reading B again. stamp uses it so that the
 * whole-record checksum does not read the body a second time after BODYCRC did.
 * Products mod p(x) take one carry-less multiply and four table steps where
 * the CPU has it (~2 ns; the bit loop, ~30 ns, is the reference and the
 * fallback), and x^(8n) comes from three 256-entry tables: ~7 ns a combine. */
#define CRC32_POLY 0xEDB88320u
static uint32_t x2n_table[32];     /* x^(2^n) mod p(x), filled by crc_combine_init */
static uint32_t x8n_table[3][256]; /* x^(8 * b * 256^j) mod p(x) */

/* a(x) * b(x) mod p(x), reflected: the bit loop. */
static uint32_t multmodp_bits(uint32_t a, uint32_t b) {
    uint32_t m = (uint32_t)1 << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = (b & 1) ? (b >> 1) ^ CRC32_POLY : b >> 1;
    }
    return p;
}

#ifdef HAVE_CLMUL_PATH
/* The same product: the 63-bit carry-less product, shifted into the reflected
 * 64-bit layout (bit 63 is x^0); its high half is reduced already, its low half
 * (x^32..x^63) is x^32 times a 32-bit polynomial, which four zero-byte CRC
 * steps reduce. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t multmodp_clmul(uint32_t a, uint32_t b) {
    __m128i x = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)a), _mm_cvtsi32_si128((int)b), 0x00);
    uint64_t r = (uint64_t)_mm_cvtsi128_si64(x) << 1;
    uint32_t c = (uint32_t)r;
    for (int i = 0; i < 4; i++) c = crc_table[0][c & 0xFF] ^ (c >> 8);
    return (uint32_t)(r >> 32) ^ c;
}
#endif

static uint32_t multmodp(uint32_t a, uint32_t b) {
#ifdef HAVE_CLMUL_PATH
    if (have_clmul) return multmodp_clmul(a, b);
#endif
    return multmodp_bits(a, b);
}

/* x^(n * 2^k) mod p(x), from x2n_table. */
static uint32_t x2nmodp(uint64_t n, unsigned k) {
    uint32_t p = (uint32_t)1 << 31; /* x^0 == 1 */
    while (n) {
        if (n & 1) p = multmodp(x2n_table[k & 31], p);
        n >>= 1;
        k++;
    }
    return p;
}

/* After crc_init (the tables are built with the bit loop either way). */
static void crc_combine_init(void) {
    uint32_t p = (uint32_t)1 << 30; /* x^1 */
    x2n_table[0] = p;
    for (int n = 1; n < 32; n++) x2n_table[n] = p = multmodp_bits(p, p);
    for (int j = 0; j < 3; j++) {
        uint32_t step = x2nmodp((uint64_t)1 << (8 * j), 3);
        x8n_table[j][0] = (uint32_t)1 << 31;
        for (int b = 1; b < 256; b++) x8n_table[j][b] = multmodp_bits(x8n_table[j][b - 1], step);
    }
}

/* x^(8 * len) mod p(x): the shift of a CRC past len bytes. */
static uint32_t x8nmodp(uint64_t len) {
    if (len >> 24) return x2nmodp(len, 3);
    uint32_t p = x8n_table[0][len & 0xFF];
    if ((len >> 8) & 0xFF) p = multmodp(x8n_table[1][(len >> 8) & 0xFF], p);
    if (len >> 16) p = multmodp(x8n_table[2][len >> 16], p);
    return p;
}

static uint32_t crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2) {
    return multmodp(x8nmodp(len2), crc1) ^ crc2;
}

/* ---- crc32_combine(crc1, crc2, len2) -> int: the Python face, for the parity test */
static PyObject *py_crc32_combine(PyObject *self, PyObject *args) {
    unsigned int crc1, crc2;
    unsigned long long len2;
    if (!PyArg_ParseTuple(args, "IIK", &crc1, &crc2, &len2)) return NULL;
    return PyLong_FromUnsignedLong(crc32_combine(crc1, crc2, len2));
}

/* ---- big-endian fields ------------------------------------------------------ */

static inline int32_t get_i32(const uint8_t *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}
static inline uint32_t get_u32(const uint8_t *p) { return (uint32_t)get_i32(p); }
static inline int16_t get_i16(const uint8_t *p) {
    return (int16_t)(((uint16_t)p[0] << 8) | (uint16_t)p[1]);
}
static inline int64_t get_i64(const uint8_t *p) {
    return (int64_t)(((uint64_t)get_u32(p) << 32) | (uint64_t)get_u32(p + 4));
}
static inline void put_i32(uint8_t *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (uint8_t)(u >> 24);
    p[1] = (uint8_t)(u >> 16);
    p[2] = (uint8_t)(u >> 8);
    p[3] = (uint8_t)u;
}
static inline void put_i64(uint8_t *p, int64_t v) {
    put_i32(p, (int32_t)((uint64_t)v >> 32));
    put_i32(p + 4, (int32_t)(uint64_t)v);
}

/* Strict UTF-8 (what Python's decoder accepts): no overlongs, surrogates or > U+10FFFF. */
static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            /* Runs of ASCII 8 bytes at a time: properties and topics mostly are. */
            while (i + 8 <= n) {
                uint64_t w;
                memcpy(&w, s + i, 8);
                if (w & 0x8080808080808080ULL) break;
                i += 8;
            }
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return 0;
        }
        if (i + need >= n) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
        i += need + 1;
    }
    return 1;
}

/* ---- one record ------------------------------------------------------------- */

typedef struct {
    int64_t phys;        /* PHYSICALOFFSET as stored */
    int64_t queue_offset;
    int64_t store_ts;
    int32_t size;
    int32_t queue_id;
    int32_t sys_flag;
    int32_t crc;         /* BODYCRC as stored */
    uint32_t body_off, body_len; /* relative to the record */
    uint32_t topic_off, topic_len;
    uint32_t props_off, props_len;
    uint32_t store_ts_off;       /* STORETIMESTAMP, STOREHOSTADDRESS follow */
    int64_t tags_hash;           /* ConsumeQueue tagsCode; valid when tags_ascii */
    uint32_t tags_off, tags_len; /* TAGS value, relative to the record */
    int tags_ascii;
} rec_t;

typedef struct {
    char text[128];
} reason_t;

static int is_dispatchable(int32_t sys_flag) {
    int t = sys_flag & TRANSACTION_TYPE_MASK;
    return t != TRANSACTION_PREPARED_TYPE && t != TRANSACTION_ROLLBACK_TYPE;
}

/*
 * Parse the record at p with `avail` readable bytes. Returns the walk kind:
 * KIND_MORE for a valid message (r filled), KIND_END, KIND_BLANK (r->size =
 * blank length) or KIND_CORRUPT (why filled). check_record's rules, in order.
 */
static int parse_record(const uint8_t *p, int64_t avail, rec_t *r, reason_t *why) {
    if (avail < 8) return KIND_END;
    int32_t size = get_i32(p);
    uint32_t magic = get_u32(p + 4);
    r->size = size;
    if (magic == BLANK_MAGIC_CODE) return KIND_BLANK;
    if (magic != MESSAGE_MAGIC_CODE) {
        if (size == 0 && magic == 0) return KIND_END;
        snprintf(why->text, sizeof why->text, "bad magic code 0x%08X", magic);
        return KIND_CORRUPT;
    }
    if (size < MIN_RECORD_SIZE || (int64_t)size > avail) {
        snprintf(why->text, sizeof why->text, "TOTALSIZE %d out of range", size);
        return KIND_CORRUPT;
    }
    r->crc = get_i32(p + 8);
    r->queue_id = get_i32(p + 12);
    r->queue_offset = get_i64(p + 20);
    r->phys = get_i64(p + 28);
    r->sys_flag = get_i32(p + 36);
    int64_t q = PREFIX_SIZE + ((r->sys_flag & BORNHOST_V6_FLAG) ? 20 : 8);
    r->store_ts_off = (uint32_t)q;
    r->store_ts = get_i64(p + q);
    q += 8 + ((r->sys_flag & STOREHOSTADDRESS_V6_FLAG) ? 20 : 8) + 12;
    if (q + 4 > size) {
        snprintf(why->text, sizeof why->text, "header longer than TOTALSIZE");
        return KIND_CORRUPT;
    }
    int32_t body_len = get_i32(p + q);
    q += 4;
    if (body_len < 0 || q + body_len + 3 > size) {
        snprintf(why->text, sizeof why->text, "BODYLEN %d inconsistent", body_len);
        return KIND_CORRUPT;
    }
    r->body_off = (uint32_t)q;
    r->body_len = (uint32_t)body_len;
    q += body_len;
    uint32_t topic_len = p[q];
    if (topic_len > MAX_TOPIC_BYTES || q + 1 + topic_len + 2 > (int64_t)size) {
        snprintf(why->text, sizeof why->text, "TOPICLEN %u inconsistent", topic_len);
        return KIND_CORRUPT;
    }
    r->topic_off = (uint32_t)(q + 1);
    r->topic_len = topic_len;
    q += 1 + topic_len;
    int32_t props_len = get_i16(p + q);
    q += 2;
    if (props_len < 0 || q + props_len != size) {
        snprintf(why->text, sizeof why->text, "TOTALSIZE %d but fields span %lld bytes", size,
                 (long long)(q + props_len));
        return KIND_CORRUPT;
    }
    r->props_off = (uint32_t)q;
    r->props_len = (uint32_t)props_len;
    return KIND_MORE;
}

/* The TAGS property's value and its Java hashCode (ASCII here; others need Python). */
static void find_tags(const uint8_t *rec, rec_t *r) {
    const uint8_t *block = rec + r->props_off, *end = block + r->props_len;
    r->tags_hash = 0;
    r->tags_len = 0;
    r->tags_ascii = 1;
    /* Properties are a few dozen bytes: a plain scan for the name at the start
     * of the block or after a \x02 beats memmem's set-up. */
    for (const uint8_t *s = block; end - s >= 5; s++) {
        const uint8_t *hit = s;
        if (hit[0] != 'T' || memcmp(hit, "TAGS\x01", 5) != 0) continue;
        if (hit == block || hit[-1] == 2) {
            const uint8_t *v = hit + 5;
            const uint8_t *ve = memchr(v, 2, (size_t)(end - v));
            if (ve == NULL) ve = end;
            r->tags_off = (uint32_t)(v - rec);
            r->tags_len = (uint32_t)(ve - v);
            uint32_t h = 0;
            for (const uint8_t *c = v; c < ve; c++) {
                if (*c >= 0x80) {
                    r->tags_ascii = 0;
                    return;
                }
                h = 31u * h + *c;
            }
            r->tags_hash = (int32_t)h;
            return;
        }
    }
}

/* ---- SCHEDULE_TOPIC_XXXX's tagsCode: the message's due time -----------------
 * delays: NULL/None (no rule: every topic's tagsCode is its TAGS hash) or a
 * tuple of each delay level's delay in ms (MessageStoreConfig.delay_levels_ms).
 * A record of SCHEDULE_TOPIC_XXXX whose DELAY property is a level (1 to 9
 * ASCII digits, > 0) gets store_ts + the delay of min(level, len(delays)) as
 * its tagsCode, as RocketMQ's checkMessageAndReturnSize computes it
 * (computeDeliverTimestamp); any other record keeps r->tags_hash. Reference:
 * basalt.common.record.consume_queue_tags_code. Needs the GIL; -1 with an
 * exception set on error. */
#define SCHEDULE_TOPIC "SCHEDULE_TOPIC_XXXX"
#define SCHEDULE_TOPIC_LEN 19

static int check_delays(PyObject *delays) {
    if (delays == NULL || delays == Py_None || PyTuple_Check(delays)) return 0;
    PyErr_SetString(PyExc_TypeError, "delays must be a tuple of ms or None");
    return -1;
}

static int schedule_code(const uint8_t *rec, rec_t *r, int64_t store_ts, PyObject *delays) {
    if (delays == NULL || delays == Py_None || PyTuple_GET_SIZE(delays) == 0) return 0;
    if (r->topic_len != SCHEDULE_TOPIC_LEN ||
        memcmp(rec + r->topic_off, SCHEDULE_TOPIC, SCHEDULE_TOPIC_LEN) != 0)
        return 0;
    const uint8_t *block = rec + r->props_off, *end = block + r->props_len;
    for (const uint8_t *s = block; end - s >= 6; s++) {
        if (s[0] != 'D' || memcmp(s, "DELAY\x01", 6) != 0 || (s != block && s[-1] != 2)) continue;
        const uint8_t *v = s + 6;
        const uint8_t *ve = memchr(v, 2, (size_t)(end - v));
        if (ve == NULL) ve = end;
        if (ve - v < 1 || ve - v > 9) return 0;
        long long level = 0;
        for (const uint8_t *c = v; c < ve; c++) {
            if (*c < '0' || *c > '9') return 0;
            level = level * 10 + (*c - '0');
        }
        if (level <= 0) return 0;
        Py_ssize_t n = PyTuple_GET_SIZE(delays);
        if (level > n) level = n; /* RocketMQ: past the last level waits the last */
        long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(delays, level - 1));
        if (d == -1 && PyErr_Occurred()) return -1;
        r->tags_hash = store_ts + d;
        return 0;
    }
    return 0;
}

/* tagsCode of a non-ASCII TAGS value: decode like Python (errors="replace"), hash UTF-16. */
static int tags_hash_slow(const uint8_t *v, uint32_t n, int64_t *out) {
    PyObject *s = PyUnicode_DecodeUTF8((const char *)v, n, "replace");
    if (s == NULL) return -1;
    Py_ssize_t len = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    uint32_t h = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c > 0xFFFF) {
            c -= 0x10000;
            h = 31u * h + (0xD800 + (c >> 10));
            h = 31u * h + (0xDC00 + (c & 0x3FF));
        } else {
            h = 31u * h + c;
        }
    }
    Py_DECREF(s);
    *out = (int32_t)h;
    return 0;
}

/* ---- the whole-record checksum (RocketMQ 5's enabledAppendPropCRC) ------------
 * A record may end with the property "__CRC32#\x01" + 10 digits + "\x02": the
 * CRC32 of every byte before it, least significant digit first. The store writes
 * the digits (stamp) into the property an encoder reserved; readers check it
 * instead of BODYCRC when it is there (common.record.has_crc32_property). */
#define CRC32_RESERVED_LEN 20
#define CRC32_PREFIX "__CRC32#\x01"
#define CRC32_PREFIX_LEN 9

/* Whether the record's properties end with the CRC32 property (digits unchecked). */
static int has_crc32_prop(const uint8_t *p, const rec_t *r) {
    if (r->props_len < CRC32_RESERVED_LEN || p[r->size - 1] != 2) return 0;
    const uint8_t *at = p + r->size - CRC32_RESERVED_LEN;
    if (memcmp(at, CRC32_PREFIX, CRC32_PREFIX_LEN) != 0) return 0;
    return r->props_len == CRC32_RESERVED_LEN || at[-1] == 2;
}

static int32_t record_crc(const uint8_t *p, int32_t size) {
    return (int32_t)(crc32_update(0, p, (size_t)(size - CRC32_RESERVED_LEN)) & 0x7FFFFFFF);
}

/* Bodies at least this long are not read a second time for the record's CRC.
 * With the carry-less product a combine costs ~7 ns, less than reading 64 bytes
 * again; with the bit loop ~0.1 us, about a second pass over 2 KiB (measured on
 * the benchmark VM). */
#ifdef HAVE_CLMUL_PATH
#define COMBINE_MIN_BODY (have_clmul ? 64u : 2048u)
#else
#define COMBINE_MIN_BODY 2048u
#endif

/* Write the digits of the CRC32 property the record ends with (createCrc32's
 * order). body_crc is the full CRC32 of the body (before BODYCRC's masking). */
static void fill_crc32_prop(uint8_t *p, const rec_t *r, uint32_t body_crc) {
    uint32_t crc;
    if (r->body_len >= COMBINE_MIN_BODY) {
        crc = crc32_update(0, p, r->body_off);
        crc = crc32_combine(crc, body_crc, r->body_len);
        uint32_t tail = r->body_off + r->body_len;
        crc = crc32_update(crc, p + tail, (size_t)(r->size - CRC32_RESERVED_LEN) - tail);
    } else {
        crc = crc32_update(0, p, (size_t)(r->size - CRC32_RESERVED_LEN));
    }
    crc &= 0x7FFFFFFF;
    uint8_t *d = p + r->size - 1 - 10;
    for (int i = 0; i < 10; i++) {
        d[i] = (uint8_t)('0' + crc % 10);
        crc /= 10;
    }
}

static int body_crc_ok(const uint8_t *p, const rec_t *r) {
    return (int32_t)(crc32_update(0, p + r->body_off, r->body_len) & 0x7FFFFFFF) == r->crc;
}

/* The record's checksum, as check_record's _crc_mismatch (a zeroed tail first): the CRC32 property
 * when the record carries it (it covers the body too: one pass for a sound
 * record), else BODYCRC; a mismatch names the body when BODYCRC fails too. */
static int check_crc32(const uint8_t *p, const rec_t *r, reason_t *why) {
    if (r->props_len > 0 && p[r->props_off + r->props_len - 1] == 0) {
        /* basalt.common.record.ZEROED_PROPERTIES: every property ends with \x02, so
         * a zero there is a tail a lost write cleared, CRC32 property and all. */
        snprintf(why->text, sizeof why->text,
                 "PROPERTIES end in a zero byte (a lost write cleared the record's tail)");
        return KIND_CORRUPT;
    }
    if (has_crc32_prop(p, r)) {
        const uint8_t *d = p + r->size - 1 - 10;
        int64_t stored = 0;
        for (int i = 9; i >= 0; i--) {
            if (d[i] < '0' || d[i] > '9') {
                snprintf(why->text, sizeof why->text, "CRC32 property is not 10 digits");
                return KIND_CORRUPT;
            }
            stored = stored * 10 + (d[i] - '0');
        }
        if (stored == record_crc(p, r->size)) return KIND_MORE;
    } else if (body_crc_ok(p, r)) {
        return KIND_MORE;
    }
    snprintf(why->text, sizeof why->text, "%s",
             body_crc_ok(p, r) ? "record CRC mismatch" : "body CRC mismatch");
    return KIND_CORRUPT;
}

/* What a reader checks beyond the structure, in check_record's order: the record
 * sits where it says (physical offset `at`), its body matches its CRC (when
 * asked) and its topic is UTF-8. KIND_MORE when it passes. */
static int check_stored(const uint8_t *p, const rec_t *r, int64_t at, int check_crc,
                        reason_t *why) {
    if (r->phys != at) {
        snprintf(why->text, sizeof why->text, "PHYSICALOFFSET %lld but the record sits at %lld",
                 (long long)r->phys, (long long)at);
        return KIND_CORRUPT;
    }
    if (check_crc && check_crc32(p, r, why) != KIND_MORE) return KIND_CORRUPT;
    if (!utf8_valid(p + r->topic_off, r->topic_len)) {
        snprintf(why->text, sizeof why->text, "topic is not UTF-8");
        return KIND_CORRUPT;
    }
    return KIND_MORE;
}

/* ---- growable record array -------------------------------------------------- */

typedef struct {
    rec_t *items;
    Py_ssize_t n, cap;
} recs_t;

static int recs_push(recs_t *a, const rec_t *r) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? a->cap * 2 : 256;
        rec_t *items = PyMem_RawRealloc(a->items, (size_t)cap * sizeof(rec_t));
        if (items == NULL) return -1;
        a->items = items;
        a->cap = cap;
    }
    a->items[a->n++] = *r;
    return 0;
}

/* ---- crc32(data) -> int ------------------------------------------------------ */

static PyObject *py_crc32(PyObject *self, PyObject *args) {
    Py_buffer b;
    unsigned int start = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &b, &start)) return NULL;
    uint32_t c;
    Py_BEGIN_ALLOW_THREADS c = crc32_update(start, b.buf, (size_t)b.len);
    Py_END_ALLOW_THREADS PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_crc32_portable(PyObject *self, PyObject *args) {
    Py_buffer b;
    unsigned int start = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &b, &start)) return NULL;
    uint32_t c = crc32_table(start, b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

/* ---- scan(buf, pos, limit, base_offset, check_crc, newer_than_ms) ------------
 * Recovery's walk: validate every record from pos (which sits at physical
 * offset base_offset + pos) to the first that is not a valid message.
 * Returns (pos, kind, reason, last_store_ts, first_newer_pos, count).
 */
static PyObject *py_scan(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t pos, limit;
    long long base, newer_than;
    int check_crc;
    if (!PyArg_ParseTuple(args, "y*nnLpL", &b, &pos, &limit, &base, &check_crc, &newer_than))
        return NULL;
    if (limit > b.len) limit = b.len;
    if (pos < 0) pos = 0;
    const uint8_t *buf = b.buf;
    int kind = KIND_END;
    reason_t why = {{0}};
    long long last_ts = 0, first_newer = -1, count = 0;
    Py_BEGIN_ALLOW_THREADS while (1) {
        rec_t r;
        kind = parse_record(buf + pos, (int64_t)limit - pos, &r, &why);
        if (kind != KIND_MORE) break;
        kind = check_stored(buf + pos, &r, base + pos, check_crc, &why);
        if (kind != KIND_MORE) break;
        if (r.store_ts > newer_than && first_newer < 0) first_newer = pos;
        last_ts = r.store_ts;
        pos += r.size;
        count++;
    }
    Py_END_ALLOW_THREADS PyBuffer_Release(&b);
    return Py_BuildValue("nisLLL", pos, kind, why.text, last_ts, first_newer, count);
}

/* ---- dispatch(fd, file_pos, avail, base_offset, window, want_records, topic_cache,
 *               delays=None)
 * The dispatcher's walk: pread up to len(window) bytes of the CommitLog file
 * from file_pos (avail bytes are written there, base_offset is their
 * physical offset) and walk the records, all with the GIL released once.
 * Validates structure and physical offsets (not CRCs: recovery did), skips
 * prepared/rolled-back records, and groups ConsumeQueue units into runs of
 * consecutive queue offsets per (topic, queue id).
 *
 * Returns (pos, kind, reason, consumed, last_store_ts, runs, records, need):
 *   pos     bytes of the window consumed (whole records; a blank is not)
 *   kind    KIND_MORE (the window ended; call again from pos), KIND_END
 *           (caught up with avail), KIND_BLANK (end-of-file blank at pos),
 *           KIND_CORRUPT (reason says why; pos is the bad record)
 *   runs    [(topic, queue_id, first_queue_offset, count, units bytes), ...]
 *           in order of each run's first record; units are 20-byte
 *           [phyOffset 8][size 4][tagsCode 8] big-endian.
 *   records None, or per dispatchable record (topic, queue_id, phys, size,
 *           tags_code, store_ts, queue_offset, sys_flag, props_start, props_end)
 *           with props_* positions in the window.
 *   need    with KIND_MORE and nothing consumed: the window size the next
 *           record needs (it is larger than the window).
 */
typedef struct {
    PyObject *topic; /* borrowed from the topic cache */
    int32_t queue_id;
    int64_t first_qoff, next_qoff;
    Py_ssize_t count, written;
    PyObject *units; /* bytes, filled in the second pass */
} run_t;

static PyObject *topic_for(PyObject *cache, const uint8_t *s, uint32_t n) {
    /* Borrowed reference to an interned str for these topic bytes. */
    PyObject *key = PyBytes_FromStringAndSize((const char *)s, n);
    if (key == NULL) return NULL;
    PyObject *topic = PyDict_GetItemWithError(cache, key);
    if (topic == NULL && !PyErr_Occurred()) {
        PyObject *t = PyUnicode_DecodeUTF8((const char *)s, n, NULL);
        if (t != NULL && PyDict_SetItem(cache, key, t) == 0) topic = t;
        Py_XDECREF(t);
    }
    Py_DECREF(key);
    return topic;
}

static PyObject *py_dispatch(PyObject *self, PyObject *args) {
    Py_buffer b;
    int fd, want_records;
    long long file_pos, avail, base;
    PyObject *cache, *delays = NULL;
    if (!PyArg_ParseTuple(args, "iLLLw*pO!|O", &fd, &file_pos, &avail, &base, &b, &want_records,
                          &PyDict_Type, &cache, &delays))
        return NULL;
    if (check_delays(delays) < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    uint8_t *buf = b.buf;
    Py_ssize_t pos = 0, need = 0, consumed = 0, nruns = 0;
    int kind = KIND_END, oom = 0, io_errno = 0;
    reason_t why = {{0}};
    long long last_ts = 0;
    recs_t recs = {0};
    PyObject *runs = NULL, *records = NULL, *run_index = NULL, *result = NULL;
    run_t *rv = NULL;
    Py_ssize_t *rec_run = NULL;

    Py_BEGIN_ALLOW_THREADS;
    int64_t n = avail < (int64_t)b.len ? avail : (int64_t)b.len;
    int64_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, (size_t)(n - got), (off_t)(file_pos + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            io_errno = r < 0 ? errno : EIO;
            break;
        }
        got += r;
    }
    while (!io_errno) {
        int64_t win_left = n - pos, total_left = avail - pos;
        if (total_left <= 0) {
            kind = KIND_END;
            break;
        }
        if (total_left < 8) {
            /* Below the written end every byte belongs to a record or a blank. */
            snprintf(why.text, sizeof why.text, "no record below the written end");
            kind = KIND_CORRUPT;
            break;
        }
        if (win_left < 8) {
            kind = KIND_MORE;
            need = 8;
            break;
        }
        int32_t size = get_i32(buf + pos);
        if (get_u32(buf + pos + 4) == MESSAGE_MAGIC_CODE && size >= MIN_RECORD_SIZE &&
            size > win_left && size <= total_left) {
            kind = KIND_MORE; /* the rest of this record comes with the next window */
            need = size;
            break;
        }
        rec_t r;
        kind = parse_record(buf + pos, win_left, &r, &why);
        if (kind == KIND_END) {
            /* Below the written end every byte belongs to a record or a blank. */
            snprintf(why.text, sizeof why.text, "no record below the written end");
            kind = KIND_CORRUPT;
        }
        if (kind != KIND_MORE) break;
        /* No CRC here: recovery checked what was there at start, stamp what came since. */
        kind = check_stored(buf + pos, &r, base + pos, 0, &why);
        if (kind != KIND_MORE) break;
        last_ts = r.store_ts;
        consumed++;
        if (is_dispatchable(r.sys_flag)) {
            find_tags(buf + pos, &r);
            r.phys = base + pos;
            if (recs_push(&recs, &r) < 0) {
                oom = 1;
                break;
            }
        }
        pos += r.size;
    }
    Py_END_ALLOW_THREADS;

    if (io_errno) {
        errno = io_errno;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    if (oom) {
        PyErr_NoMemory();
        goto done;
    }
    /* Second pass, with the GIL: group into runs, build Python objects. */
    runs = PyList_New(0);
    run_index = PyDict_New();
    if (runs == NULL || run_index == NULL) goto done;
    if (want_records && (records = PyList_New(recs.n)) == NULL) goto done;
    if (recs.n) {
        rv = PyMem_Calloc((size_t)recs.n, sizeof(run_t));
        rec_run = PyMem_Calloc((size_t)recs.n, sizeof(Py_ssize_t));
        if (rv == NULL || rec_run == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    PyObject *prev_topic = NULL;
    const uint8_t *prev_topic_bytes = NULL;
    uint32_t prev_topic_len = 0;
    Py_ssize_t last_run = -1;
    for (Py_ssize_t i = 0; i < recs.n; i++) {
        rec_t *r = &recs.items[i];
        const uint8_t *rec = buf + (r->phys - base);
        const uint8_t *tb = rec + r->topic_off;
        PyObject *topic;
        if (prev_topic != NULL && r->topic_len == prev_topic_len &&
            memcmp(tb, prev_topic_bytes, r->topic_len) == 0) {
            topic = prev_topic;
        } else {
            topic = topic_for(cache, tb, r->topic_len);
            if (topic == NULL) goto done;
            prev_topic = topic;
            prev_topic_bytes = tb;
            prev_topic_len = r->topic_len;
        }
        if (!r->tags_ascii && tags_hash_slow(rec + r->tags_off, r->tags_len, &r->tags_hash) < 0)
            goto done;
        if (schedule_code(rec, r, r->store_ts, delays) < 0) goto done;
        /* Find the open run of (topic, queue_id) that this record continues. */
        Py_ssize_t ri = -1;
        if (last_run >= 0 && rv[last_run].topic == topic && rv[last_run].queue_id == r->queue_id &&
            rv[last_run].next_qoff == r->queue_offset) {
            ri = last_run;
        } else {
            PyObject *key = Py_BuildValue("(Oi)", topic, r->queue_id);
            if (key == NULL) goto done;
            PyObject *found = PyDict_GetItemWithError(run_index, key);
            if (found != NULL) {
                Py_ssize_t k = PyLong_AsSsize_t(found);
                if (rv[k].next_qoff == r->queue_offset) ri = k;
            } else if (PyErr_Occurred()) {
                Py_DECREF(key);
                goto done;
            }
            if (ri < 0) {
                ri = nruns++;
                rv[ri].topic = topic;
                rv[ri].queue_id = r->queue_id;
                rv[ri].first_qoff = r->queue_offset;
                PyObject *idx = PyLong_FromSsize_t(ri);
                int rc = idx == NULL ? -1 : PyDict_SetItem(run_index, key, idx);
                Py_XDECREF(idx);
                if (rc < 0) {
                    Py_DECREF(key);
                    goto done;
                }
            }
            Py_DECREF(key);
        }
        rv[ri].next_qoff = r->queue_offset + 1;
        rv[ri].count++;
        rec_run[i] = ri;
        last_run = ri;
        if (want_records) {
            Py_ssize_t rs = (Py_ssize_t)(r->phys - base);
            PyObject *t = Py_BuildValue("(OiLiLLLinn)", topic, r->queue_id, (long long)r->phys,
                                        r->size, (long long)r->tags_hash, (long long)r->store_ts,
                                        (long long)r->queue_offset, r->sys_flag,
                                        rs + (Py_ssize_t)r->props_off,
                                        rs + (Py_ssize_t)(r->props_off + r->props_len));
            if (t == NULL) goto done;
            PyList_SET_ITEM(records, i, t);
        }
    }
    for (Py_ssize_t k = 0; k < nruns; k++) {
        rv[k].units = PyBytes_FromStringAndSize(NULL, rv[k].count * 20);
        if (rv[k].units == NULL) goto done;
    }
    for (Py_ssize_t i = 0; i < recs.n; i++) {
        rec_t *r = &recs.items[i];
        run_t *run = &rv[rec_run[i]];
        uint8_t *u = (uint8_t *)PyBytes_AS_STRING(run->units) + 20 * run->written++;
        put_i64(u, r->phys);
        put_i32(u + 8, r->size);
        put_i64(u + 12, r->tags_hash);
    }
    for (Py_ssize_t k = 0; k < nruns; k++) {
        PyObject *t = Py_BuildValue("(OiLnO)", rv[k].topic, rv[k].queue_id,
                                    (long long)rv[k].first_qoff, rv[k].count, rv[k].units);
        if (t == NULL || PyList_Append(runs, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
    }
    result = Py_BuildValue("nisnLOOn", pos, kind, why.text, consumed, last_ts, runs,
                           records ? records : Py_None, need);
done:
    if (rv != NULL) {
        for (Py_ssize_t k = 0; k < nruns; k++) Py_XDECREF(rv[k].units);
        PyMem_Free(rv);
    }
    PyMem_Free(rec_run);
    PyMem_RawFree(recs.items);
    Py_XDECREF(runs);
    Py_XDECREF(records);
    Py_XDECREF(run_index);
    PyBuffer_Release(&b);
    return result;
}

/* ---- stamp(buf, start, end, base_phys, queue_offset, store_ts, store_host, ----
 *            topic, queue_id, max_body_size, refuse_transactional=False, delays=None)
 * The write side: buf[start:end] holds records encoded by a producer
 * (common.record.encode_batch) for one (topic, queue id). Validates each exactly as a read
 * would, and more strictly in one way: its properties must be UTF-8 (a read keeps
 * a stored record whose properties are not; see check_record). Then writes what only
 * the broker knows: BODYCRC (computed here, never
 * trusted from the client), QUEUEOFFSET, PHYSICALOFFSET (base_phys is the
 * offset of buf[start]), STORETIMESTAMP and STOREHOSTADDRESS; then, in a record
 * whose properties end with the reserved CRC32 property, its digits (the
 * checksum of everything stamped before).
 * Prepared/rolled-back records take queue offset 0 and no place in the queue;
 * with refuse_transactional (a producer's batch) any transactional record is
 * refused, as RocketMQ refuses a transactional MessageBatch.
 * Returns (next_queue_offset, physical_offsets, queue_offsets, sizes, units):
 * tuples, and the 20-byte ConsumeQueue units of the dispatchable records
 * (consecutive queue offsets from queue_offset), which the dispatcher can
 * take instead of reading the records back. Raises ValueError naming the
 * first bad record, leaving buf unusable.
 */
typedef struct {
    uint8_t *buf;
    Py_ssize_t start, end;
    long long base, next_qoff, store_ts, max_body;
    const uint8_t *host, *topic;
    Py_ssize_t host_len, topic_len;
    int queue_id;
    int refuse_transactional; /* a producer's batch: RocketMQ refuses transactions in one */
    /* out */
    recs_t recs;
    reason_t why;
    Py_ssize_t bad_at, index, dispatchable;
} stamp_t;

enum { STAMP_OK = 0, STAMP_BAD = 1, STAMP_NOMEM = 2 };

/* Raise ValueError("record N (byte B of the batch): <why>") for a refused record,
 * with <why> alone as its ``reason`` attribute: a caller that words the refusal of
 * a lone record as a message's takes it from there rather than from the text. */
static void set_bad_record(Py_ssize_t index, Py_ssize_t at, const char *why) {
    /* Decoded as PyErr_Format's %s decodes: UTF-8, errors replaced. */
    PyObject *reason = PyUnicode_DecodeUTF8(why, (Py_ssize_t)strlen(why), "replace");
    if (reason == NULL) return;
    PyObject *error = PyObject_CallFunction(
        PyExc_ValueError, "N",
        PyUnicode_FromFormat("record %zd (byte %zd of the batch): %U", index, at, reason));
    if (error != NULL && PyObject_SetAttrString(error, "reason", reason) == 0)
        PyErr_SetObject(PyExc_ValueError, error);
    Py_XDECREF(error);
    Py_DECREF(reason);
}

/* Validate and stamp every record of st->buf[start:end]; touches no Python object. */
static int stamp_walk(stamp_t *st) {
    int32_t host_flag = st->host_len == 20 ? STOREHOSTADDRESS_V6_FLAG : 0;
    reason_t *why = &st->why;
    Py_ssize_t pos = st->start;
    while (pos < st->end) {
        uint8_t *p = st->buf + pos;
        rec_t r;
        int kind = parse_record(p, (int64_t)st->end - pos, &r, why);
        st->bad_at = pos;
        if (kind != KIND_MORE) {
            if (kind != KIND_CORRUPT)
                snprintf(why->text, sizeof why->text, "not a message record (magic 0x%08X)",
                         (st->end - pos >= 8) ? get_u32(p + 4) : 0u);
            return STAMP_BAD;
        }
        if ((r.sys_flag & STOREHOSTADDRESS_V6_FLAG) != host_flag) {
            snprintf(why->text, sizeof why->text,
                     "store host is %s but the record's SYSFLAG says %s",
                     host_flag ? "IPv6" : "IPv4", host_flag ? "IPv4" : "IPv6");
            return STAMP_BAD;
        }
        if (r.topic_len != (uint32_t)st->topic_len ||
            memcmp(p + r.topic_off, st->topic, (size_t)st->topic_len) != 0) {
            snprintf(why->text, sizeof why->text, "record topic differs from the batch's");
            return STAMP_BAD;
        }
        if (r.queue_id != st->queue_id) {
            snprintf(why->text, sizeof why->text,
                     "record queue id %d differs from the batch's %d", r.queue_id, st->queue_id);
            return STAMP_BAD;
        }
        /* The topic is UTF-8 already (it equals the batch's, a str). Properties
         * must be too: readers decode them with errors="replace", so a bad byte
         * stored would change a value between send and pull, and a SQL92 filter
         * or a key lookup would see the replacement. The separators are ASCII,
         * so the whole block is valid exactly when every name and value is. */
        if (!utf8_valid(p + r.props_off, r.props_len)) {
            snprintf(why->text, sizeof why->text, "properties are not UTF-8");
            return STAMP_BAD;
        }
        if (st->refuse_transactional && (r.sys_flag & TRANSACTION_TYPE_MASK) != 0) {
            snprintf(why->text, sizeof why->text, "a transactional message cannot be batched");
            return STAMP_BAD;
        }
        if ((long long)r.body_len > st->max_body) {
            snprintf(why->text, sizeof why->text,
                     "body of %u bytes exceeds max_message_size %lld", r.body_len, st->max_body);
            return STAMP_BAD;
        }
        uint32_t body_crc = crc32_update(0, p + r.body_off, r.body_len);
        put_i32(p + 8, (int32_t)(body_crc & 0x7FFFFFFF));
        r.phys = st->base + (pos - st->start);
        /* Prepared and rolled-back records take no place in any queue. */
        r.queue_offset = is_dispatchable(r.sys_flag) ? st->next_qoff++ : 0;
        if (is_dispatchable(r.sys_flag)) {
            find_tags(p, &r);
            st->dispatchable++;
        }
        put_i64(p + 20, r.queue_offset);
        put_i64(p + 28, r.phys);
        put_i64(p + r.store_ts_off, st->store_ts);
        memcpy(p + r.store_ts_off + 8, st->host, (size_t)st->host_len);
        /* Last: the checksum covers every field stamped above. */
        if (has_crc32_prop(p, &r)) fill_crc32_prop(p, &r, body_crc);
        if (recs_push(&st->recs, &r) < 0) return STAMP_NOMEM;
        pos += r.size;
        st->index++;
    }
    return STAMP_OK;
}

/* Below this many bytes a batch is stamped holding the GIL: handing the GIL
 * to another thread and back costs more than the walk itself. */
#define STAMP_RELEASE_GIL_BYTES (1 << 20)

static PyObject *py_stamp(PyObject *self, PyObject *args) {
    Py_buffer b, host, topic;
    stamp_t st;
    memset(&st, 0, sizeof st);
    PyObject *delays = NULL;
    if (!PyArg_ParseTuple(args, "w*nnLLLy*y*iL|pO", &b, &st.start, &st.end, &st.base,
                          &st.next_qoff, &st.store_ts, &host, &topic, &st.queue_id,
                          &st.max_body, &st.refuse_transactional, &delays))
        return NULL;
    PyObject *result = NULL;
    recs_t recs = {0};
    if (check_delays(delays) < 0) goto done;
    if (st.start < 0 || st.end > b.len || st.start > st.end ||
        (host.len != 8 && host.len != 20)) {
        PyErr_SetString(PyExc_ValueError, "bad batch bounds or store host");
        goto done;
    }
    /* The schedule rule only for a run of SCHEDULE_TOPIC_XXXX (a run is one topic). */
    if (topic.len != SCHEDULE_TOPIC_LEN || memcmp(topic.buf, SCHEDULE_TOPIC, SCHEDULE_TOPIC_LEN))
        delays = NULL;
    st.buf = b.buf;
    st.host = host.buf;
    st.host_len = host.len;
    st.topic = topic.buf;
    st.topic_len = topic.len;
    int rc;
    if (st.end - st.start >= STAMP_RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS rc = stamp_walk(&st);
        Py_END_ALLOW_THREADS
    } else {
        rc = stamp_walk(&st);
    }
    recs = st.recs;
    if (rc == STAMP_NOMEM) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc == STAMP_BAD) {
        set_bad_record(st.index, st.bad_at - st.start, st.why.text);
        goto done;
    }
    /* The ConsumeQueue units of the dispatchable records, ready for the dispatcher. */
    PyObject *units = PyBytes_FromStringAndSize(NULL, st.dispatchable * 20);
    PyObject *phys = PyTuple_New(recs.n), *qoffs = PyTuple_New(recs.n),
             *sizes = PyTuple_New(recs.n);
    if (units == NULL || phys == NULL || qoffs == NULL || sizes == NULL) goto fail;
    uint8_t *u = (uint8_t *)PyBytes_AS_STRING(units);
    for (Py_ssize_t i = 0; i < recs.n; i++) {
        rec_t *r = &recs.items[i];
        PyObject *a = PyLong_FromLongLong(r->phys);
        PyObject *q = PyLong_FromLongLong(r->queue_offset);
        PyObject *z = PyLong_FromLong(r->size);
        if (a == NULL || q == NULL || z == NULL) {
            Py_XDECREF(a);
            Py_XDECREF(q);
            Py_XDECREF(z);
            goto fail;
        }
        PyTuple_SET_ITEM(phys, i, a);
        PyTuple_SET_ITEM(qoffs, i, q);
        PyTuple_SET_ITEM(sizes, i, z);
        if (!is_dispatchable(r->sys_flag)) continue;
        const uint8_t *rec = st.buf + st.start + (r->phys - st.base);
        if (!r->tags_ascii && tags_hash_slow(rec + r->tags_off, r->tags_len, &r->tags_hash) < 0)
            goto fail;
        if (schedule_code(rec, r, st.store_ts, delays) < 0) goto fail;
        put_i64(u, r->phys);
        put_i32(u + 8, r->size);
        put_i64(u + 12, r->tags_hash);
        u += 20;
    }
    result = Py_BuildValue("LNNNN", st.next_qoff, phys, qoffs, sizes, units);
    goto done;
fail:
    Py_XDECREF(units);
    Py_XDECREF(phys);
    Py_XDECREF(qoffs);
    Py_XDECREF(sizes);
done:
    PyMem_RawFree(recs.items);
    PyBuffer_Release(&b);
    PyBuffer_Release(&host);
    PyBuffer_Release(&topic);
    return result;
}

/* ---- gather: the pull path's loop over ConsumeQueue units ----------------------- *
 * Takes the records the units point at in one CommitLog file (`log`, starting at
 * physical offset log_base, log_end bytes readable) until the batch is full, a
 * unit points elsewhere, or a candidate needs Python's filter check; appends one
 * bytes object holding them back to back to the list `out`. */

enum { GATHER_DONE = 0, GATHER_FULL = 1, GATHER_ELSEWHERE = 2, GATHER_CONFIRM = 3 };
/* The size of a ConsumeQueue filler unit (RocketMQ writes Integer.MAX_VALUE). */
#define BLANK_UNIT_SIZE 0x7FFFFFFF

/* RocketMQ's isTheBatchFull: never full before the first message. */
static int batch_full(int64_t size, int64_t count, int64_t total, int64_t max_nums,
                      int64_t max_bytes, int64_t max_count) {
    if (count == 0 || total == 0) return 0;
    if (max_nums <= count) return 1;
    if (total + size > max_bytes) return 1;
    return count > max_count - 1;
}

static PyObject *py_gather(PyObject *self, PyObject *args) {
    Py_buffer units = {0}, log = {0};
    Py_ssize_t i, n;
    long long log_base, log_end, count, total, max_nums, in_memory_from;
    long long mem_bytes, mem_count, disk_bytes, disk_count;
    PyObject *codes, *out;
    int confirm;
    if (!PyArg_ParseTuple(args, "y*nny*LLLLLLLLLLOpO", &units, &i, &n, &log, &log_base, &log_end,
                          &count, &total, &max_nums, &in_memory_from, &mem_bytes, &mem_count,
                          &disk_bytes, &disk_count, &codes, &confirm, &out))
        return NULL;
    PyObject *result = NULL;
    int64_t *want = NULL;
    Py_ssize_t nwant = -1; /* -1: every tagsCode matches */
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        goto done;
    }
    if (n < 0 || i < 0 || n * 20 > units.len || log_end < 0 || log_end > log.len) {
        PyErr_SetString(PyExc_ValueError, "unit range or log end out of bounds");
        goto done;
    }
    if (codes != Py_None) {
        if (!PyTuple_Check(codes)) {
            PyErr_SetString(PyExc_TypeError, "codes must be a tuple of ints or None");
            goto done;
        }
        nwant = PyTuple_GET_SIZE(codes);
        want = PyMem_Malloc(sizeof(int64_t) * (size_t)(nwant ? nwant : 1));
        if (want == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t k = 0; k < nwant; k++) {
            want[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(codes, k));
            if (want[k] == -1 && PyErr_Occurred()) goto done;
        }
    }
    const uint8_t *u = units.buf;
    const uint8_t *lg = log.buf;
    int stop = GATHER_DONE;
    /* Pass 1 picks the records (positions in `log`), pass 2 copies them with one
     * resize of `out`: no reallocation per record. */
    Py_ssize_t cap = n - i, picked = 0;
    if (cap > max_nums - count + 1) cap = max_nums - count + 1;
    if (cap < 1) cap = 1;
    int64_t *picks = PyMem_Malloc(sizeof(int64_t) * 2 * (size_t)cap);
    if (picks == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t added = 0;
    for (; i < n; i++) {
        const uint8_t *unit = u + i * 20;
        int64_t phy = get_i64(unit);
        int64_t size = get_i32(unit + 8);
        int64_t tags = get_i64(unit + 12);
        if (size <= 0 || size == BLANK_UNIT_SIZE) continue; /* a filler unit: no record */
        int in_memory = phy >= in_memory_from;
        if (batch_full(size, count, total, max_nums, in_memory ? mem_bytes : disk_bytes,
                       in_memory ? mem_count : disk_count)) {
            stop = GATHER_FULL;
            break;
        }
        if (nwant >= 0) {
            Py_ssize_t k = 0;
            while (k < nwant && want[k] != tags) k++;
            if (k == nwant) continue; /* no tag of the subscription: skip without a read */
        }
        int64_t rel = phy - log_base;
        if (size <= 0 || rel < 0 || rel + size > log_end) {
            stop = GATHER_ELSEWHERE; /* another file, or gone: Python decides */
            break;
        }
        const uint8_t *rec = lg + rel;
        if (get_i32(rec) != size || get_u32(rec + 4) != MESSAGE_MAGIC_CODE ||
            get_i64(rec + 28) != phy)
            continue; /* not the unit's record (damage recovery set aside): skip it */
        if (confirm) {
            stop = GATHER_CONFIRM;
            break;
        }
        if (picked == cap) { /* cannot happen: the count cap stops the loop first */
            stop = GATHER_FULL;
            break;
        }
        picks[2 * picked] = rel;
        picks[2 * picked + 1] = size;
        picked++;
        added += size;
        count++;
        total += size;
    }
    if (picked) {
        PyObject *chunk = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)added);
        if (chunk == NULL) {
            PyMem_Free(picks);
            goto done;
        }
        char *dst = PyBytes_AS_STRING(chunk);
        for (Py_ssize_t k = 0; k < picked; k++) {
            memcpy(dst, lg + picks[2 * k], (size_t)picks[2 * k + 1]);
            dst += picks[2 * k + 1];
        }
        int failed = PyList_Append(out, chunk);
        Py_DECREF(chunk);
        if (failed) {
            PyMem_Free(picks);
            goto done;
        }
    }
    PyMem_Free(picks);
    result = Py_BuildValue("nLLi", i, count, total, stop);
done:
    PyMem_Free(want);
    PyBuffer_Release(&units);
    PyBuffer_Release(&log);
    return result;
}

/* ---- index_put: IndexFile entries for the keys of stored records ------------------ */

enum { INDEX_DONE = 0, INDEX_FULL = 1, INDEX_BLANK = 2, INDEX_CORRUPT = 3 };
#define INDEX_HEADER_SIZE 40
#define INDEX_ENTRY_SIZE 20
#define INT32_MAX_VALUE 2147483647LL

/* The value of property `name` in a properties block, or NULL. */
static const uint8_t *find_prop(const uint8_t *block, const uint8_t *end, const char *name,
                                size_t name_len, const uint8_t **value_end) {
    for (const uint8_t *s = block; (size_t)(end - s) > name_len; s++) {
        if (s[0] != (uint8_t)name[0] || memcmp(s, name, name_len) != 0 || s[name_len] != 1)
            continue;
        if (s == block || s[-1] == 2) {
            const uint8_t *v = s + name_len + 1;
            const uint8_t *ve = memchr(v, 2, (size_t)(end - v));
            *value_end = ve == NULL ? end : ve;
            return v;
        }
    }
    return NULL;
}

/* Java's String.hashCode continued over UTF-8 bytes, by UTF-16 code unit. An
 * invalid byte counts as U+FFFD (stored keys are UTF-8: the producer's strings). */
static uint32_t java_hash_utf8(uint32_t h, const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t c = s[i];
        if (c < 0x80) {
            h = 31u * h + c;
            i++;
            continue;
        }
        uint32_t cp = 0xFFFD;
        size_t len = 1;
        if ((c & 0xE0) == 0xC0 && i + 1 < n && (s[i + 1] & 0xC0) == 0x80 && c >= 0xC2) {
            cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
            len = 2;
        } else if ((c & 0xF0) == 0xE0 && i + 2 < n && (s[i + 1] & 0xC0) == 0x80 &&
                   (s[i + 2] & 0xC0) == 0x80) {
            cp = ((c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
            len = 3;
            if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD, len = 1;
        } else if ((c & 0xF8) == 0xF0 && i + 3 < n && (s[i + 1] & 0xC0) == 0x80 &&
                   (s[i + 2] & 0xC0) == 0x80 && (s[i + 3] & 0xC0) == 0x80) {
            cp = ((c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
                 ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
            len = 4;
            if (cp < 0x10000 || cp > 0x10FFFF) cp = 0xFFFD, len = 1;
        }
        if (cp > 0xFFFF) {
            cp -= 0x10000;
            h = 31u * h + (0xD800 + (cp >> 10));
            h = 31u * h + (0xDC00 + (cp & 0x3FF));
        } else {
            h = 31u * h + cp;
        }
        i += len;
    }
    return h;
}

typedef struct {
    int64_t begin_ts, end_ts, begin_phy, end_phy, slot_count, count;
} index_state_t;

/* One IndexFile entry for topic#key (IndexFile.put_key's rules); 0 when full. */
static int index_put_key(uint8_t *mm, int64_t slots, int64_t num, index_state_t *st,
                         const uint8_t *topic, size_t topic_len, const uint8_t *key,
                         size_t key_len, int64_t phys, int64_t store_ts) {
    if (st->count >= num) return 0;
    uint32_t h = java_hash_utf8(0, topic, topic_len);
    h = 31u * h + '#';
    h = java_hash_utf8(h, key, key_len);
    int32_t sh = (int32_t)h;
    int64_t key_hash = sh == INT32_MIN ? 0 : (sh < 0 ? -(int64_t)sh : sh);
    uint8_t *slot = mm + INDEX_HEADER_SIZE + (key_hash % slots) * 4;
    int64_t slot_value = get_i32(slot);
    if (slot_value <= 0 || slot_value > st->count) slot_value = 0;
    int64_t diff = 0;
    if (st->begin_ts > 0 && store_ts - st->begin_ts >= 0) {
        diff = (store_ts - st->begin_ts) / 1000;
        if (diff > INT32_MAX_VALUE) diff = INT32_MAX_VALUE;
    }
    uint8_t *e = mm + INDEX_HEADER_SIZE + slots * 4 + st->count * INDEX_ENTRY_SIZE;
    put_i32(e, (int32_t)key_hash);
    put_i64(e + 4, phys);
    put_i32(e + 12, (int32_t)diff);
    put_i32(e + 16, (int32_t)slot_value);
    /* The entry before the slot that names it: a concurrent reader (which reads
     * the slot first) never follows a slot to an entry not yet written. The
     * slot itself is one aligned 4-byte store (slots start at byte 40). */
    __atomic_thread_fence(__ATOMIC_RELEASE);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint32_t be = __builtin_bswap32((uint32_t)st->count);
#else
    uint32_t be = (uint32_t)st->count;
#endif
    __atomic_store_n((uint32_t *)(void *)slot, be, __ATOMIC_RELAXED);
    if (st->count <= 1) {
        st->begin_ts = store_ts;
        st->begin_phy = phys;
    }
    st->end_ts = store_ts;
    st->end_phy = phys;
    st->slot_count += slot_value == 0;
    st->count++;
    /* The header bytes after every entry, as RocketMQ's IndexHeader does: readers
     * take indexCount from here, so an entry is found as soon as its slot is
     * written, not only once the whole call returns. indexCount goes last. */
    put_i64(mm, st->begin_ts);
    put_i64(mm + 8, st->end_ts);
    put_i64(mm + 16, st->begin_phy);
    put_i64(mm + 24, st->end_phy);
    put_i32(mm + 32, (int32_t)st->slot_count);
    __atomic_thread_fence(__ATOMIC_RELEASE);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    __atomic_store_n((uint32_t *)(void *)(mm + 36), __builtin_bswap32((uint32_t)st->count),
                     __ATOMIC_RELAXED);
#else
    __atomic_store_n((uint32_t *)(void *)(mm + 36), (uint32_t)st->count, __ATOMIC_RELAXED);
#endif
    return 1;
}

static PyObject *py_index_put(PyObject *self, PyObject *args) {
    Py_buffer log = {0}, idx = {0};
    Py_ssize_t pos, limit, skip;
    long long base, slots, num;
    index_state_t st;
    if (!PyArg_ParseTuple(args, "y*nnLw*LL(LLLLLL)n", &log, &pos, &limit, &base, &idx, &slots,
                          &num, &st.begin_ts, &st.end_ts, &st.begin_phy, &st.end_phy,
                          &st.slot_count, &st.count, &skip))
        return NULL;
    PyObject *result = NULL;
    if (pos < 0 || limit > log.len || pos > limit || slots <= 0 || num <= 0 ||
        INDEX_HEADER_SIZE + slots * 4 + num * INDEX_ENTRY_SIZE > idx.len) {
        PyErr_SetString(PyExc_ValueError, "index_put: range or index geometry out of bounds");
        goto done;
    }
    int stop = INDEX_DONE;
    Py_ssize_t keys_done = skip;
    reason_t why = {{0}};
    const uint8_t *lg = log.buf;
    uint8_t *mm = idx.buf;
    Py_BEGIN_ALLOW_THREADS
    while (pos < limit) {
        rec_t r;
        int kind = parse_record(lg + pos, limit - pos, &r, &why);
        if (kind == KIND_BLANK) {
            stop = INDEX_BLANK;
            break;
        }
        if (kind == KIND_MORE && st.count >= num) {
            /* RocketMQ gets (or creates) the last file before it looks at a record,
             * even one it then skips: a full file means a new one here too. */
            stop = INDEX_FULL;
            break;
        }
        if (kind != KIND_MORE) {
            if (kind == KIND_END) snprintf(why.text, sizeof why.text, "no record");
            stop = INDEX_CORRUPT;
            break;
        }
        int64_t phys = base + pos;
        /* RocketMQ: skip what the last file already covers (re-dispatch after a
         * restart), and rolled-back transactional records. */
        if (phys >= st.end_phy && (r.sys_flag & TRANSACTION_TYPE_MASK) != TRANSACTION_ROLLBACK_TYPE) {
            const uint8_t *rec = lg + pos;
            const uint8_t *block = rec + r.props_off, *bend = block + r.props_len;
            const uint8_t *topic = rec + r.topic_off;
            Py_ssize_t k = 0; /* keys of this record put so far (UNIQ_KEY first) */
            const uint8_t *ve;
            const uint8_t *v = find_prop(block, bend, "UNIQ_KEY", 8, &ve);
            int full = 0;
            if (v != NULL && ve > v) { /* an empty value is no property (Java drops it) */
                if (k >= keys_done) {
                    if (!index_put_key(mm, slots, num, &st, topic, r.topic_len, v,
                                       (size_t)(ve - v), phys, r.store_ts)) {
                        full = 1;
                    }
                }
                if (!full) k++;
            }
            v = full ? NULL : find_prop(block, bend, "KEYS", 4, &ve);
            while (v != NULL && v < ve) {
                const uint8_t *sp = memchr(v, ' ', (size_t)(ve - v));
                const uint8_t *ke = sp == NULL ? ve : sp;
                if (ke > v) {
                    if (k >= keys_done) {
                        if (!index_put_key(mm, slots, num, &st, topic, r.topic_len, v,
                                           (size_t)(ke - v), phys, r.store_ts)) {
                            full = 1;
                            break;
                        }
                    }
                    k++;
                }
                v = ke + 1;
            }
            if (full) {
                keys_done = k;
                stop = INDEX_FULL;
                break;
            }
        }
        keys_done = 0;
        pos += r.size;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("nn(LLLLLL)is", pos, keys_done, st.begin_ts, st.end_ts, st.begin_phy,
                           st.end_phy, st.slot_count, st.count, stop, why.text);
done:
    PyBuffer_Release(&log);
    PyBuffer_Release(&idx);
    return result;
}

/* ---- the SDK's codec: decode_records and encode_batch ------------------------ *
 * The client's side of the layout. A consumer turns a pull's records (stored
 * records back to back) into MessageRecord objects with decode_records; a
 * producer encodes a batch of Messages into the records a store-node stamps
 * (basalt.store.batch) with encode_batch. Per message, Python would spend ~9 us on
 * either; here it is well under one. Each has a Python reference that the tests
 * hold it to, byte for byte and field for field: common.record.decode_records_py
 * (check_record, then decode_record) and common.record.encode_batch_py
 * (EncodedMessage). Both run holding the GIL: they build Python objects.
 */

/* MessageRecord's fields in common.message's order (exported; a test compares). */
static const char *const RECORD_FIELDS[] = {
    "store_size",
    "body_crc",
    "queue_id",
    "flag",
    "queue_offset",
    "commit_log_offset",
    "sys_flag",
    "born_timestamp_ms",
    "born_host",
    "store_timestamp_ms",
    "store_host",
    "reconsume_times",
    "prepared_transaction_offset",
    "body",
    "topic",
    "properties",
};
#define N_RECORD_FIELDS ((int)(sizeof RECORD_FIELDS / sizeof RECORD_FIELDS[0]))

/*
 * Where each named slot of a __slots__ class (a dataclass with slots=True) lives
 * in its instances: the member descriptors' offsets. Reading or filling a slot
 * through its offset is what the descriptor itself does, minus an attribute
 * lookup per field per message. TypeError unless every name is an object slot
 * of `type` or a base.
 */
static int slot_offsets(PyTypeObject *type, const char *const *names, int n, Py_ssize_t *out) {
    for (int i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttrString((PyObject *)type, names[i]);
        if (d == NULL && !PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        int ok = d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
                 !(((PyMemberDescrObject *)d)->d_member->flags & READONLY) &&
                 PyType_IsSubtype(type, ((PyDescrObject *)d)->d_type);
        if (ok) out[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_XDECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", type->tp_name, names[i]);
            return -1;
        }
    }
    return 0;
}

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* A few recently seen short byte strings and their str (property names, hosts,
 * topics): a pull's records repeat them, and a cached str keeps its hash. */
#define SMALL_CACHE 8
#define SMALL_CACHE_BYTES 32
#define SHORT_VALUE 16 /* property values that decode_props caches */
typedef struct {
    struct {
        uint8_t raw[SMALL_CACHE_BYTES];
        Py_ssize_t len;
        PyObject *str;
    } e[SMALL_CACHE];
    int n, next;
} str_cache_t;

static void str_cache_clear(str_cache_t *c) {
    for (int i = 0; i < c->n; i++) Py_CLEAR(c->e[i].str);
    c->n = 0;
}

/* New reference to the cached str of raw[0:len], or NULL (no error set) on a miss. */
static PyObject *str_cache_get(str_cache_t *c, const uint8_t *raw, Py_ssize_t len) {
    for (int i = 0; i < c->n; i++)
        if (c->e[i].len == len && memcmp(c->e[i].raw, raw, (size_t)len) == 0) {
            Py_INCREF(c->e[i].str);
            return c->e[i].str;
        }
    return NULL;
}

static void str_cache_put(str_cache_t *c, const uint8_t *raw, Py_ssize_t len, PyObject *str) {
    if (len > SMALL_CACHE_BYTES) return;
    int i = c->n < SMALL_CACHE ? c->n++ : (c->next++ % SMALL_CACHE);
    Py_XSETREF(c->e[i].str, Py_NewRef(str));
    memcpy(c->e[i].raw, raw, (size_t)len);
    c->e[i].len = len;
}

/* UTF-8 with errors="replace" (what decode_properties does), through the cache. */
static PyObject *cached_text(str_cache_t *c, const uint8_t *s, Py_ssize_t n) {
    PyObject *str = str_cache_get(c, s, n);
    if (str != NULL) return str;
    str = PyUnicode_DecodeUTF8((const char *)s, n, "replace");
    if (str != NULL) str_cache_put(c, s, n, str);
    return str;
}

/* A host field (ip + port, 8 or 20 bytes) as common.message.decode_host words it:
 * Python keeps the one definition of the text; the cache keeps it off the path. */
static PyObject *host_text(str_cache_t *c, PyObject *decode_host, const uint8_t *raw,
                           Py_ssize_t len) {
    PyObject *str = str_cache_get(c, raw, len);
    if (str != NULL) return str;
    PyObject *b = PyBytes_FromStringAndSize((const char *)raw, len);
    if (b == NULL) return NULL;
    str = PyObject_CallOneArg(decode_host, b);
    Py_DECREF(b);
    if (str != NULL && !PyUnicode_Check(str)) {
        PyErr_SetString(PyExc_TypeError, "decode_host must return str");
        Py_CLEAR(str);
    }
    if (str != NULL) str_cache_put(c, raw, len, str);
    return str;
}

/*
 * decode_properties: pairs split at \x02, each at its first \x01; a pair with no
 * \x01 (e.g. the empty one after the last \x02) is skipped, a later name wins.
 * Splitting the bytes before decoding equals decoding before splitting, since
 * the replace handler never swallows an ASCII byte.
 */
static PyObject *decode_props(const uint8_t *s, Py_ssize_t n, str_cache_t *names,
                              str_cache_t *values) {
    PyObject *d = PyDict_New();
    if (d == NULL || n == 0) return d;
    const uint8_t *end = s + n;
    for (;;) {
        const uint8_t *e = memchr(s, 2, (size_t)(end - s));
        if (e == NULL) e = end;
        const uint8_t *sep = memchr(s, 1, (size_t)(e - s));
        if (sep != NULL) {
            PyObject *name = cached_text(names, s, sep - s);
            /* Values repeat less: only short ones (a tag, not a UNIQ_KEY) go through a
             * cache, so that unique ones neither evict them nor pay for the lookup. */
            Py_ssize_t vlen = e - sep - 1;
            PyObject *value = vlen <= SHORT_VALUE
                                  ? cached_text(values, sep + 1, vlen)
                                  : PyUnicode_DecodeUTF8((const char *)sep + 1, vlen, "replace");
            int rc = (name == NULL || value == NULL) ? -1 : PyDict_SetItem(d, name, value);
            Py_XDECREF(name);
            Py_XDECREF(value);
            if (rc < 0) {
                Py_DECREF(d);
                return NULL;
            }
        }
        if (e == end) return d;
        s = e + 1;
    }
}

typedef struct {
    PyTypeObject *type;
    Py_ssize_t off[sizeof RECORD_FIELDS / sizeof RECORD_FIELDS[0]];
    PyObject *decode_host;
    str_cache_t hosts, topics, names, values;
} decoder_t;

/* The MessageRecord of the valid record at p (parse_record filled r). */
static PyObject *record_object(decoder_t *dc, const uint8_t *p, const rec_t *r) {
    Py_ssize_t bh = (r->sys_flag & BORNHOST_V6_FLAG) ? 20 : 8;
    Py_ssize_t sh = (r->sys_flag & STOREHOSTADDRESS_V6_FLAG) ? 20 : 8;
    const uint8_t *after_hosts = p + r->store_ts_off + 8 + sh;
    PyObject *v[sizeof RECORD_FIELDS / sizeof RECORD_FIELDS[0]];
    v[0] = PyLong_FromLong(r->size);
    v[1] = PyLong_FromLong(r->crc);
    v[2] = PyLong_FromLong(r->queue_id);
    v[3] = PyLong_FromLong(get_i32(p + 16));
    v[4] = PyLong_FromLongLong(r->queue_offset);
    v[5] = PyLong_FromLongLong(r->phys);
    v[6] = PyLong_FromLong(r->sys_flag);
    v[7] = PyLong_FromLongLong(get_i64(p + 40));
    v[8] = host_text(&dc->hosts, dc->decode_host, p + PREFIX_SIZE, bh);
    v[9] = PyLong_FromLongLong(r->store_ts);
    v[10] = host_text(&dc->hosts, dc->decode_host, p + r->store_ts_off + 8, sh);
    v[11] = PyLong_FromLong(get_i32(after_hosts));
    v[12] = PyLong_FromLongLong(get_i64(after_hosts + 4));
    v[13] = PyBytes_FromStringAndSize((const char *)p + r->body_off, r->body_len);
    v[14] = cached_text(&dc->topics, p + r->topic_off, r->topic_len); /* valid UTF-8 */
    /* The store's CRC32 property is a checksum of the record, not a property sent. */
    uint32_t props_len = r->props_len - (has_crc32_prop(p, r) ? CRC32_RESERVED_LEN : 0);
    v[15] = decode_props(p + r->props_off, props_len, &dc->names, &dc->values);
    PyObject *o = NULL;
    int ok = 1;
    for (int i = 0; i < N_RECORD_FIELDS; i++) ok &= v[i] != NULL;
    if (ok) o = dc->type->tp_alloc(dc->type, 0);
    if (o == NULL) {
        for (int i = 0; i < N_RECORD_FIELDS; i++) Py_XDECREF(v[i]);
        return NULL;
    }
    for (int i = 0; i < N_RECORD_FIELDS; i++) SLOT(o, dc->off[i]) = v[i]; /* steals */
    /* Out of the cyclic GC, as CPython takes tuples of atomic values out: every
     * field is an int, str, bytes or a dict of str (itself untracked), so no
     * cycle can run through the record. Tracked, a pull's thousands of records
     * survive to the oldest generation and trigger full collections: a fifth
     * of a consumer's time. (Only a non-str value put into properties, which
     * its type forbids, could close a cycle; the GC would not collect it.) */
    if (PyObject_IS_GC(o)) PyObject_GC_UnTrack(o);
    return o;
}

/*
 * A record whose checksum fails (check_crc32's reason in why), in a reader that
 * skips such records: damaged_type(position in data, topic, queue_id,
 * queue_offset, commit_log_offset, reason) is appended to `damaged`; with no
 * list (None) error_type(position, reason) is raised instead. 0 when appended,
 * -1 with an exception set. The header's fields are as stored: the damage may
 * be in them (the reason says "record CRC mismatch" then).
 */
static int report_damaged(PyObject *damaged, PyObject *damaged_type, PyObject *error_type,
                          Py_ssize_t pos, const uint8_t *p, const rec_t *r, const char *reason) {
    PyObject *item;
    if (damaged == NULL || damaged == Py_None) {
        PyObject *err = PyObject_CallFunction(error_type, "ns", pos, reason);
        if (err != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(err), err);
            Py_DECREF(err);
        }
        return -1;
    }
    item = PyObject_CallFunction(damaged_type, "nNiLLs", pos,
                                 PyUnicode_DecodeUTF8((const char *)p + r->topic_off,
                                                      r->topic_len, "replace"),
                                 r->queue_id, (long long)r->queue_offset, (long long)r->phys,
                                 reason);
    if (item == NULL) return -1;
    int rc = PyList_Append(damaged, item);
    Py_DECREF(item);
    return rc;
}

/* One step of a reader's walk over stored records at data[pos:end], in
 * check_record's order (the framing, the checksum when asked, the topic's
 * UTF-8): STEP_RECORD with `r` filled; STEP_DAMAGED when the checksum failed
 * and the record was reported (report_damaged; the caller skips r->size
 * bytes); STEP_ERROR with a Python error set: error_type(pos, reason) for a
 * broken frame (decode_records_py's reason), or the report's own failure. */
enum { STEP_RECORD, STEP_DAMAGED, STEP_ERROR };

static int read_step(const uint8_t *data, Py_ssize_t pos, Py_ssize_t end, int check_crc,
                     PyObject *damaged, PyObject *damaged_type, PyObject *error_type, rec_t *r) {
    const uint8_t *p = data + pos;
    reason_t why;
    int kind = parse_record(p, end - pos, r, &why);
    if (kind == KIND_MORE && check_crc && check_crc32(p, r, &why) != KIND_MORE) {
        if (report_damaged(damaged, damaged_type, error_type, pos, p, r, why.text) < 0)
            return STEP_ERROR;
        return STEP_DAMAGED;
    }
    if (kind == KIND_MORE && !utf8_valid(p + r->topic_off, r->topic_len)) {
        snprintf(why.text, sizeof why.text, "topic is not UTF-8");
        kind = KIND_CORRUPT;
    }
    if (kind == KIND_MORE) return STEP_RECORD;
    if (end - pos < 8)
        snprintf(why.text, sizeof why.text, "%zd bytes left, too few for a record", end - pos);
    else if (kind != KIND_CORRUPT) /* a blank or zeroes: not a message */
        snprintf(why.text, sizeof why.text, "bad magic code 0x%08X", get_u32(p + 4));
    PyObject *err = PyObject_CallFunction(error_type, "ns", pos, why.text);
    if (err != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(err), err);
        Py_DECREF(err);
    }
    return STEP_ERROR;
}

/*
 * decode_records(data, record_type, decode_host, error_type, check_crc=False,
 *                damaged=None, damaged_type=None) -> list
 * Every record of data (stored records back to back, as a pull returns them)
 * as a record_type (MessageRecord) instance, its slots filled directly (the
 * dataclass's __init__ only assigns them). Each record must pass check_record's
 * rules; the first that does not raises error_type(position in data, reason)
 * with decode_records_py's reason. With check_crc, a record whose checksum
 * fails (its framing sound) is left out and reported (report_damaged).
 */
static PyObject *py_decode_records(PyObject *self, PyObject *args) {
    Py_buffer b;
    decoder_t dc;
    memset(&dc, 0, sizeof dc);
    PyObject *error_type, *damaged = Py_None, *damaged_type = Py_None;
    int check_crc = 0;
    if (!PyArg_ParseTuple(args, "y*O!OO|pOO", &b, &PyType_Type, &dc.type, &dc.decode_host,
                          &error_type, &check_crc, &damaged, &damaged_type))
        return NULL;
    PyObject *list = NULL;
    if (slot_offsets(dc.type, RECORD_FIELDS, N_RECORD_FIELDS, dc.off) < 0) goto done;
    list = PyList_New(0);
    const uint8_t *data = b.buf;
    Py_ssize_t pos = 0;
    while (list != NULL && pos < b.len) {
        const uint8_t *p = data + pos;
        rec_t r;
        int step = read_step(data, pos, b.len, check_crc, damaged, damaged_type, error_type, &r);
        if (step == STEP_ERROR) {
            Py_CLEAR(list);
            break;
        }
        if (step == STEP_DAMAGED) {
            pos += r.size;
            continue;
        }
        PyObject *o = record_object(&dc, p, &r);
        if (o == NULL || PyList_Append(list, o) < 0) Py_CLEAR(list);
        Py_XDECREF(o);
        pos += r.size;
    }
done:
    str_cache_clear(&dc.hosts);
    str_cache_clear(&dc.topics);
    str_cache_clear(&dc.names);
    str_cache_clear(&dc.values);
    PyBuffer_Release(&b);
    return list;
}

/* ---- encode_batch ------------------------------------------------------------- */

/* The Message fields encode_batch reads (queue_id is the batch's). */
enum {
    M_TOPIC,
    M_BODY,
    M_TAGS,
    M_KEYS,
    M_PROPERTIES,
    M_FLAG,
    M_SYS_FLAG,
    M_BORN_TS,
    M_BORN_HOST,
    M_RECONSUME,
    M_PREPARED,
    N_MESSAGE_FIELDS
};
static const char *const MESSAGE_FIELDS[N_MESSAGE_FIELDS] = {
    "topic",     "body",     "tags",
    "keys",      "properties", "flag",
    "sys_flag",  "born_timestamp_ms", "born_host",
    "reconsume_times", "prepared_transaction_offset",
};


/* A growable byte buffer (the batch's property blocks, back to back). */
typedef struct {
    uint8_t *p;
    Py_ssize_t n, cap;
} bytes_t;

static int bytes_put(bytes_t *s, const void *src, Py_ssize_t n) {
    if (s->n + n > s->cap) {
        Py_ssize_t cap = s->cap ? s->cap : 4096;
        while (cap < s->n + n) cap *= 2;
        uint8_t *p = PyMem_Realloc(s->p, (size_t)cap);
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->n, src, (size_t)n);
    s->n += n;
    return 0;
}

/* Append str's UTF-8; -1 with no error set when it has none (lone surrogates), or
 * with MemoryError set. */
static int bytes_put_str(bytes_t *s, PyObject *str) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(str, &n);
    if (u == NULL) {
        PyErr_Clear();
        return -1;
    }
    return bytes_put(s, u, n);
}

typedef struct {
    PyObject *body; /* new reference */
    const char *topic;
    Py_ssize_t topic_len, props_at, props_len;
    int64_t size, born_ts, prepared, sys_flag;
    int32_t flag, reconsume, born_port;
    uint8_t born_ip[16];
    int born_ip_len;
} enc_t;

/* An int the reference would pack into [lo, hi]; -1 (no error set) otherwise. */
static int int_field(PyObject *o, long long lo, long long hi, long long *out) {
    if (o == NULL || !(PyLong_CheckExact(o) || PyBool_Check(o))) return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    if (v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

#define INT32_LO (-2147483647LL - 1)
#define INT32_HI 2147483647LL

enum { PROP_UNIQ = 1, PROP_TAGS = 2, PROP_KEYS = 4 };

/*
 * The properties block of one message: all_properties() of the message the
 * producer sends, encoded. That message is the user's with UNIQ_KEY set
 * ({**properties, UNIQ_KEY: uniq}); all_properties then sets TAGS and KEYS. A
 * name already present keeps its place with the new value; a new one goes last,
 * in that order. 0, or -1 when only the reference can encode it (a MemoryError
 * is the one error left set).
 */
static int encode_props(bytes_t *s, PyObject *props, PyObject *uniq, PyObject *tags,
                        PyObject *keys_text) {
    static const char *const special[3] = {"UNIQ_KEY", "TAGS", "KEYS"};
    PyObject *special_value[3] = {uniq, tags, keys_text};
    int seen = 0;
    Py_ssize_t i = 0;
    PyObject *k, *v;
    while (PyDict_Next(props, &i, &k, &v)) {
        if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(v)) return -1;
        for (int j = 0; j < 3; j++)
            if (special_value[j] != NULL && PyUnicode_CompareWithASCIIString(k, special[j]) == 0) {
                v = special_value[j];
                seen |= 1 << j;
                break;
            }
        if (bytes_put_str(s, k) < 0 || bytes_put(s, "\x01", 1) < 0 || bytes_put_str(s, v) < 0 ||
            bytes_put(s, "\x02", 1) < 0)
            return -1;
    }
    for (int j = 0; j < 3; j++) {
        if (special_value[j] == NULL || (seen & (1 << j))) continue;
        if (bytes_put(s, special[j], (Py_ssize_t)strlen(special[j])) < 0 ||
            bytes_put(s, "\x01", 1) < 0 || bytes_put_str(s, special_value[j]) < 0 ||
            bytes_put(s, "\x02", 1) < 0)
            return -1;
    }
    return 0;
}

/*
 * Read one message into e (pass 1). 0, or -1 when only the reference can
 * encode it; with an exception set only for MemoryError.
 */
static int encode_prepare(PyObject *m, PyObject *uniq, const Py_ssize_t *off,
                          PyTypeObject *message_type, PyObject *host_parts,
                          PyObject **last_born_host, enc_t *last_born, bytes_t *props,
                          int64_t born_ts_default, int store_v6, enc_t *e) {
    PyObject *f[N_MESSAGE_FIELDS];
    if (Py_TYPE(m) != message_type || !PyUnicode_CheckExact(uniq)) return -1;
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        f[i] = SLOT(m, off[i]);
        if (f[i] == NULL) return -1;
    }
    if (!PyUnicode_CheckExact(f[M_TOPIC]) || !PyBytes_CheckExact(f[M_BODY]) ||
        !PyDict_CheckExact(f[M_PROPERTIES]))
        return -1;
    e->topic = PyUnicode_AsUTF8AndSize(f[M_TOPIC], &e->topic_len);
    if (e->topic == NULL) {
        PyErr_Clear();
        return -1;
    }
    long long flag, sys_flag, born_ts, reconsume, prepared;
    if (int_field(f[M_FLAG], INT32_LO, INT32_HI, &flag) < 0 ||
        int_field(f[M_SYS_FLAG], LLONG_MIN, LLONG_MAX, &sys_flag) < 0 ||
        int_field(f[M_BORN_TS], LLONG_MIN, LLONG_MAX, &born_ts) < 0 ||
        int_field(f[M_RECONSUME], INT32_LO, INT32_HI, &reconsume) < 0 ||
        int_field(f[M_PREPARED], LLONG_MIN, LLONG_MAX, &prepared) < 0)
        return -1;
    /* Born host: (ip, port) from host_parts, which a producer calls with few strs. */
    if (f[M_BORN_HOST] != *last_born_host) {
        PyObject *parts = PyObject_CallOneArg(host_parts, f[M_BORN_HOST]);
        long long port;
        int ok = parts != NULL && PyTuple_CheckExact(parts) && PyTuple_GET_SIZE(parts) == 2 &&
                 PyBytes_CheckExact(PyTuple_GET_ITEM(parts, 0)) &&
                 (PyBytes_GET_SIZE(PyTuple_GET_ITEM(parts, 0)) == 4 ||
                  PyBytes_GET_SIZE(PyTuple_GET_ITEM(parts, 0)) == 16) &&
                 int_field(PyTuple_GET_ITEM(parts, 1), INT32_LO, INT32_HI, &port) == 0;
        if (ok) {
            last_born->born_ip_len = (int)PyBytes_GET_SIZE(PyTuple_GET_ITEM(parts, 0));
            memcpy(last_born->born_ip, PyBytes_AS_STRING(PyTuple_GET_ITEM(parts, 0)),
                   (size_t)last_born->born_ip_len);
            last_born->born_port = (int32_t)port;
            *last_born_host = f[M_BORN_HOST]; /* identity only; the message holds it */
        }
        Py_XDECREF(parts);
        if (!ok) {
            PyErr_Clear();
            return -1;
        }
    }
    e->born_ip_len = last_born->born_ip_len;
    memcpy(e->born_ip, last_born->born_ip, sizeof e->born_ip);
    e->born_port = last_born->born_port;
    /* SYSFLAG: the caller's, with the host bits set by the hosts' families. */
    sys_flag &= ~(long long)(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG);
    if (e->born_ip_len == 16) sys_flag |= BORNHOST_V6_FLAG;
    if (store_v6) sys_flag |= STOREHOSTADDRESS_V6_FLAG;
    if (sys_flag < INT32_LO || sys_flag > INT32_HI) return -1;
    /* tags and keys count when truthy, as in all_properties. */
    PyObject *tags = f[M_TAGS], *keys = f[M_KEYS], *keys_text = NULL;
    if (tags == Py_None || (PyUnicode_CheckExact(tags) && PyUnicode_GET_LENGTH(tags) == 0))
        tags = NULL;
    else if (!PyUnicode_CheckExact(tags))
        return -1;
    if (!PyTuple_CheckExact(keys) && !PyList_CheckExact(keys)) return -1;
    if (PySequence_Fast_GET_SIZE(keys) > 0) {
        PyObject *sep = PyUnicode_FromOrdinal(' ');
        keys_text = sep == NULL ? NULL : PyUnicode_Join(sep, keys);
        Py_XDECREF(sep);
        if (keys_text == NULL) {
            PyErr_Clear();
            return -1;
        }
    }
    e->props_at = props->n;
    int rc = encode_props(props, f[M_PROPERTIES], uniq, tags, keys_text);
    Py_XDECREF(keys_text);
    if (rc < 0) return -1; /* with MemoryError set, or none: the reference's turn */
    /* The CRC32 property, reserved last for the store to fill (encode_props ends on \x02). */
    if (bytes_put(props, CRC32_PREFIX "0000000000\x02", CRC32_RESERVED_LEN) < 0) return -1;
    e->props_len = props->n - e->props_at;
    if (e->props_len > 32767) return -1; /* PROPLEN is a short: the reference refuses */
    e->body = Py_NewRef(f[M_BODY]);
    e->flag = (int32_t)flag;
    e->sys_flag = sys_flag;
    e->born_ts = born_ts ? born_ts : born_ts_default;
    e->reconsume = (int32_t)reconsume;
    e->prepared = prepared;
    e->size = PREFIX_SIZE + (e->born_ip_len == 16 ? 20 : 8) + 8 + (store_v6 ? 20 : 8) + 4 + 8 +
              4 + PyBytes_GET_SIZE(e->body) + 1 + e->topic_len + 2 + e->props_len;
    return e->size > INT32_HI ? -1 : 0;
}

/* One record in common.record's layout, the broker's fields zero (pass 2). */
static uint8_t *encode_put(uint8_t *o, const enc_t *e, int32_t queue_id, const uint8_t *props,
                           const uint8_t *store_host, Py_ssize_t store_host_len) {
    memset(o, 0, PREFIX_SIZE);
    put_i32(o, (int32_t)e->size);
    put_i32(o + 4, (int32_t)MESSAGE_MAGIC_CODE);
    /* BODYCRC 0: the store computes it (stamp) */
    put_i32(o + 12, queue_id);
    put_i32(o + 16, e->flag);
    /* QUEUEOFFSET, PHYSICALOFFSET 0: the store assigns them */
    put_i32(o + 36, (int32_t)e->sys_flag);
    put_i64(o + 40, e->born_ts);
    o += PREFIX_SIZE;
    memcpy(o, e->born_ip, (size_t)e->born_ip_len);
    put_i32(o + e->born_ip_len, e->born_port);
    o += e->born_ip_len + 4;
    put_i64(o, 0); /* STORETIMESTAMP: the store's */
    o += 8;
    memcpy(o, store_host, (size_t)store_host_len);
    o += store_host_len;
    put_i32(o, e->reconsume);
    put_i64(o + 4, e->prepared);
    Py_ssize_t body_len = PyBytes_GET_SIZE(e->body);
    put_i32(o + 12, (int32_t)body_len);
    o += 16;
    memcpy(o, PyBytes_AS_STRING(e->body), (size_t)body_len);
    o += body_len;
    /* TOPICLEN's low byte, as the reference writes it: a long topic is the store's to refuse. */
    *o++ = (uint8_t)(e->topic_len & 0xFF);
    memcpy(o, e->topic, (size_t)e->topic_len);
    o += e->topic_len;
    o[0] = (uint8_t)(e->props_len >> 8);
    o[1] = (uint8_t)e->props_len;
    o += 2;
    memcpy(o, props + e->props_at, (size_t)e->props_len);
    return o + e->props_len;
}

/*
 * encode_batch(messages, uniq_keys, queue_id, store_host, born_timestamp_ms,
 *              message_type, host_parts) -> bytes | None
 * common.record.encode_batch_py's bytes, or None when this fast path cannot vouch
 * for them: a message not exactly of message_type, a field of another type than
 * the common ones (non-str property, non-bytes body, ...), or anything the
 * reference would refuse (a PROPLEN past 32767, an int out of its field's range,
 * a str with no UTF-8). The caller then runs the reference, which gives the
 * result or raises the same error as always.
 */
static PyObject *py_encode_batch(PyObject *self, PyObject *args) {
    PyObject *messages, *uniqs, *host_parts, *queue_id_obj, *born_ts_obj;
    PyTypeObject *message_type;
    long long queue_id, born_ts_default;
    Py_buffer store_host;
    if (!PyArg_ParseTuple(args, "OOOy*OO!O", &messages, &uniqs, &queue_id_obj, &store_host,
                          &born_ts_obj, &PyType_Type, &message_type, &host_parts))
        return NULL;
    PyObject *result = NULL, *ms = NULL, *us = NULL;
    enc_t *es = NULL;
    Py_ssize_t n = 0, prepared = 0;
    bytes_t props = {0};
    Py_ssize_t off[N_MESSAGE_FIELDS];
    if (slot_offsets(message_type, MESSAGE_FIELDS, N_MESSAGE_FIELDS, off) < 0) goto done;
    ms = PySequence_Tuple(messages); /* holds every message while we point into them */
    us = ms == NULL ? NULL : PySequence_Fast(uniqs, "uniq_keys must be a sequence");
    if (us == NULL) goto done;
    n = PySequence_Fast_GET_SIZE(ms);
    if (n != PySequence_Fast_GET_SIZE(us) || (store_host.len != 8 && store_host.len != 20) ||
        int_field(queue_id_obj, INT32_LO, INT32_HI, &queue_id) < 0 ||
        int_field(born_ts_obj, LLONG_MIN, LLONG_MAX, &born_ts_default) < 0)
        goto fallback;
    es = PyMem_Calloc((size_t)(n ? n : 1), sizeof *es);
    if (es == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *last_born_host = NULL;
    enc_t last_born = {0};
    int64_t total = 0;
    for (; prepared < n; prepared++) {
        if (encode_prepare(PySequence_Fast_GET_ITEM(ms, prepared),
                           PySequence_Fast_GET_ITEM(us, prepared), off, message_type, host_parts,
                           &last_born_host, &last_born, &props, born_ts_default,
                           store_host.len == 20, &es[prepared]) < 0) {
            if (PyErr_Occurred()) goto done;
            goto fallback;
        }
        total += es[prepared].size;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL) goto done;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i++)
        o = encode_put(o, &es[i], (int32_t)queue_id, props.p, store_host.buf, store_host.len);
    goto done;
fallback:
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < prepared; i++) Py_XDECREF(es[i].body);
    PyMem_Free(es);
    PyMem_Free(props.p);
    Py_XDECREF(ms);
    Py_XDECREF(us);
    PyBuffer_Release(&store_host);
    return result;
}

/*
 * slotted(cls, fields, columns) -> list
 * Instances of a __slots__ class (a dataclass with slots=True whose __init__
 * only assigns its fields: no __post_init__, no defaults to compute), built by
 * filling the slots: instance k has fields[i] = columns[i][k]. Every column is a
 * sequence of the same length. A producer's batch answers with a SendResult per
 * message, which a frozen dataclass's __init__ builds in ~1 us; this, in ~0.1.
 */
static PyObject *py_slotted(PyObject *self, PyObject *args) {
    PyTypeObject *type;
    PyObject *fields, *columns;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyType_Type, &type, &PyTuple_Type, &fields,
                          &PyTuple_Type, &columns))
        return NULL;
    Py_ssize_t nf = PyTuple_GET_SIZE(fields);
    if (PyTuple_GET_SIZE(columns) != nf || nf > 64) {
        PyErr_SetString(PyExc_ValueError, "one column per field, at most 64 fields");
        return NULL;
    }
    const char *names[64];
    Py_ssize_t off[64];
    PyObject *cols[64] = {NULL};
    PyObject *list = NULL;
    Py_ssize_t n = -1;
    for (Py_ssize_t i = 0; i < nf; i++) {
        names[i] = PyUnicode_Check(PyTuple_GET_ITEM(fields, i))
                       ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(fields, i))
                       : NULL;
        if (names[i] == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "field names are str");
            goto done;
        }
        cols[i] = PySequence_Fast(PyTuple_GET_ITEM(columns, i), "columns are sequences");
        if (cols[i] == NULL) goto done;
        if (n >= 0 && PySequence_Fast_GET_SIZE(cols[i]) != n) {
            PyErr_Format(PyExc_ValueError, "column %zd (%s) has %zd values, not %zd", i,
                         names[i], PySequence_Fast_GET_SIZE(cols[i]), n);
            goto done;
        }
        n = PySequence_Fast_GET_SIZE(cols[i]);
    }
    if (slot_offsets(type, names, (int)nf, off) < 0) goto done;
    for (Py_ssize_t i = 0; i < nf; i++)
        for (Py_ssize_t j = 0; j < i; j++)
            if (off[i] == off[j]) { /* a slot filled twice would leak its first value */
                PyErr_Format(PyExc_ValueError, "field %s named twice", names[i]);
                goto done;
            }
    list = PyList_New(n < 0 ? 0 : n);
    for (Py_ssize_t k = 0; list != NULL && k < n; k++) {
        PyObject *o = type->tp_alloc(type, 0);
        if (o == NULL) {
            Py_CLEAR(list);
            break;
        }
        for (Py_ssize_t i = 0; i < nf; i++)
            SLOT(o, off[i]) = Py_NewRef(PySequence_Fast_GET_ITEM(cols[i], k));
        PyList_SET_ITEM(list, k, o);
    }
done:
    for (Py_ssize_t i = 0; i < nf; i++) Py_XDECREF(cols[i]);
    return list;
}

/* ---- tags_code_at(buf, pos, delays=None) -> int | None ----------------------
 * The ConsumeQueue tagsCode the dispatcher derives from the record at pos
 * (Java's String.hashCode of its TAGS property, 0 without one; with delays,
 * a SCHEDULE_TOPIC_XXXX record's due time: schedule_code); None when
 * the bytes there are not a well-formed message. Recovery compares it with
 * a unit's tagsCode. Reference: basalt.store.hashing.tags_code of the
 * record's decoded TAGS.
 */
static PyObject *py_tags_code_at(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t pos;
    PyObject *delays = NULL;
    if (!PyArg_ParseTuple(args, "y*n|O", &b, &pos, &delays)) return NULL;
    PyObject *result = NULL;
    rec_t r;
    reason_t why = {{0}};
    if (check_delays(delays) < 0) goto done;
    if (pos < 0 || pos >= b.len ||
        parse_record((const uint8_t *)b.buf + pos, (int64_t)(b.len - pos), &r, &why) != KIND_MORE) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    const uint8_t *rec = (const uint8_t *)b.buf + pos;
    find_tags(rec, &r);
    if (!r.tags_ascii && tags_hash_slow(rec + r.tags_off, r.tags_len, &r.tags_hash) < 0) goto done;
    if (schedule_code(rec, &r, r.store_ts, delays) < 0) goto done;
    result = PyLong_FromLongLong((long long)r.tags_hash);
done:
    PyBuffer_Release(&b);
    return result;
}

/* ---- index_check: an IndexFile's slots and entries, checked at start ------------- */

/* The first thing wrong with the written part of an IndexFile, or "" (see
 * basalt.store.index_file.IndexFile.check). Entries 1..count-1 are the written
 * ones; every pointer a query may follow must name one of them. */
static PyObject *py_index_check(PyObject *self, PyObject *args) {
    Py_buffer idx = {0};
    long long slots, num, count, begin_phy, end_phy;
    if (!PyArg_ParseTuple(args, "y*LLLLL", &idx, &slots, &num, &count, &begin_phy, &end_phy))
        return NULL;
    PyObject *result = NULL;
    if (slots <= 0 || num <= 0 || count < 1 || count > num ||
        INDEX_HEADER_SIZE + slots * 4 + num * INDEX_ENTRY_SIZE > idx.len) {
        PyErr_SetString(PyExc_ValueError, "index_check: index geometry out of bounds");
        goto done;
    }
    char why[160] = {0};
    const uint8_t *mm = idx.buf;
    const uint8_t *entries = mm + INDEX_HEADER_SIZE + slots * 4;
    Py_BEGIN_ALLOW_THREADS
    /* Entries first, in order: a slot check below then only reads sound entries. */
    int64_t last_phy = begin_phy;
    for (int64_t i = 1; i < count && !why[0]; i++) {
        const uint8_t *e = entries + i * INDEX_ENTRY_SIZE;
        int32_t hash = get_i32(e), diff = get_i32(e + 12), prev = get_i32(e + 16);
        int64_t phy = get_i64(e + 4);
        if (hash < 0 || diff < 0)
            snprintf(why, sizeof why, "entry %lld: key hash %d or time diff %d negative",
                     (long long)i, hash, diff);
        else if (prev < 0 || prev >= i)
            snprintf(why, sizeof why, "entry %lld: previous entry %d not an older entry",
                     (long long)i, prev);
        else if (phy < last_phy || phy > end_phy)
            snprintf(why, sizeof why,
                     "entry %lld: commitlog offset %lld outside [%lld, %lld] or below the "
                     "entry before",
                     (long long)i, (long long)phy, (long long)last_phy, end_phy);
        else if (prev > 0 && get_i32(entries + (int64_t)prev * INDEX_ENTRY_SIZE) % slots !=
                                 hash % slots)
            snprintf(why, sizeof why, "entry %lld: previous entry %d is in another slot",
                     (long long)i, prev);
        last_phy = phy;
    }
    for (int64_t s = 0; s < slots && !why[0]; s++) {
        int32_t v = get_i32(mm + INDEX_HEADER_SIZE + s * 4);
        if (v < 0 || v >= count)
            snprintf(why, sizeof why, "slot %lld: entry %d not written (index count %lld)",
                     (long long)s, v, count);
        else if (v > 0 && get_i32(entries + (int64_t)v * INDEX_ENTRY_SIZE) % slots != s)
            snprintf(why, sizeof why, "slot %lld: entry %d belongs to another slot",
                     (long long)s, v);
    }
    Py_END_ALLOW_THREADS
    result = PyUnicode_FromString(why);
done:
    PyBuffer_Release(&idx);
    return result;
}

/* ---- arrow_columns ------------------------------------------------------------ */

/* One property pair of a record: raw name and value, pointing into the record. */
typedef struct {
    const uint8_t *name, *value;
    uint32_t name_len, value_len;
} prop_t;

/* The record's properties as decode_properties splits them: pairs at \x02, each at
 * its first \x01, no-\x01 pairs skipped, a later name replacing an earlier one's
 * value in its place (a dict's rule). *props grows as needed (PyMem_Raw*: no GIL
 * needed); returns the count, or -1 when out of memory (no error set). */
static Py_ssize_t split_props(const uint8_t *s, Py_ssize_t n, prop_t **props,
                              Py_ssize_t *cap) {
    Py_ssize_t count = 0;
    const uint8_t *end = s + n;
    while (n > 0) {
        const uint8_t *e = memchr(s, 2, (size_t)(end - s));
        if (e == NULL) e = end;
        const uint8_t *sep = memchr(s, 1, (size_t)(e - s));
        if (sep != NULL) {
            prop_t p = {s, sep + 1, (uint32_t)(sep - s), (uint32_t)(e - sep - 1)};
            Py_ssize_t i = 0;
            while (i < count && ((*props)[i].name_len != p.name_len ||
                                 memcmp((*props)[i].name, p.name, p.name_len) != 0))
                i++;
            if (i == count) {
                if (count == *cap) {
                    Py_ssize_t grown = *cap ? *cap * 2 : 16;
                    prop_t *q = PyMem_RawRealloc(*props, (size_t)grown * sizeof *q);
                    if (q == NULL) return -1;
                    *props = q;
                    *cap = grown;
                }
                count++;
                (*props)[i].name = p.name;
                (*props)[i].name_len = p.name_len;
            }
            (*props)[i].value = p.value;
            (*props)[i].value_len = p.value_len;
        }
        if (e == end) break;
        s = e + 1;
    }
    return count;
}

static const prop_t *find_pair(const prop_t *props, Py_ssize_t count, const char *name) {
    size_t len = strlen(name);
    for (Py_ssize_t i = 0; i < count; i++)
        if (props[i].name_len == len && memcmp(props[i].name, name, len) == 0) return &props[i];
    return NULL;
}

enum { AC_TOPIC, AC_MSG_ID, AC_TAGS, AC_KEYS, AC_PROP_KEYS, AC_PROP_VALUES, AC_BODY, AC_N };

/* One input buffer: its bytes sit at [base, base + len) of the concatenation of
 * all of them, the positions arrow_columns takes and reports. */
typedef struct {
    Py_buffer view;
    Py_ssize_t base;
} seg_t;

/* A record the walk left out (its checksum failed) or stopped at (a broken frame):
 * reported once the GIL is held again, in the walk's order. */
typedef struct {
    Py_ssize_t pos; /* in the concatenation */
    const uint8_t *p;
    rec_t r;
    reason_t why;
} skip_t;

/* What the first pass over the records finds: the rows, and each column's size. */
typedef struct {
    const uint8_t **row; /* each row's record */
    Py_ssize_t rows, row_cap;
    skip_t *skips;
    Py_ssize_t n_skips, skip_cap;
    int broken;  /* the walk stopped at skips[n_skips - 1], a record that does not frame */
    int no_memory;
    int utf8_ok;
    Py_ssize_t next_pos;
    Py_ssize_t data[AC_N]; /* data bytes of each variable-width column */
    Py_ssize_t entries;    /* map entries (property pairs) */
    Py_ssize_t tags_nulls, keys_nulls;
    prop_t *props;
    Py_ssize_t props_cap;
} walk_t;

static int grow(void **items, Py_ssize_t *cap, Py_ssize_t need, size_t size) {
    if (need <= *cap) return 0;
    Py_ssize_t grown = *cap ? *cap * 2 : 16;
    while (grown < need) grown *= 2;
    void *q = PyMem_RawRealloc(*items, (size_t)grown * size);
    if (q == NULL) return -1;
    *items = q;
    *cap = grown;
    return 0;
}

/* The message id's bytes (STOREHOST + PHYSICALOFFSET) of a record: 16 or 28. */
static Py_ssize_t msg_id_len(const rec_t *r) {
    return ((r->sys_flag & STOREHOSTADDRESS_V6_FLAG) ? 20 : 8) + 8;
}

/* The properties block arrow_columns maps: without the CRC32 property. */
static uint32_t shown_props_len(const uint8_t *p, const rec_t *r) {
    return r->props_len - (has_crc32_prop(p, r) ? CRC32_RESERVED_LEN : 0);
}

/* Pass one, without the GIL: walk the records from `pos` (validated as
 * read_step does), stopping before `end`, after max_rows rows, or once the bodies
 * reach max_bytes; note each row and add up each column's size. A record whose
 * checksum fails is a skip (report = 1: left out; report = 0: the walk stops
 * there, as at a broken frame). */
static void walk_records(const seg_t *segs, Py_ssize_t n_segs, Py_ssize_t pos, Py_ssize_t end,
                         Py_ssize_t max_rows, Py_ssize_t max_bytes, int check_crc,
                         int report, walk_t *w) {
    Py_ssize_t s = 0;
    w->utf8_ok = 1;
    while (pos < end && w->rows < max_rows && (w->rows == 0 || w->data[AC_BODY] < max_bytes)) {
        while (s + 1 < n_segs && segs[s + 1].base <= pos) s++;
        const seg_t *g = &segs[s];
        Py_ssize_t stop = g->base + g->view.len < end ? g->base + g->view.len : end;
        const uint8_t *p = (const uint8_t *)g->view.buf + (pos - g->base);
        rec_t r;
        reason_t why = {{0}};
        int kind = parse_record(p, stop - pos, &r, &why);
        int damaged = kind == KIND_MORE && check_crc && check_crc32(p, &r, &why) != KIND_MORE;
        if (!damaged && kind == KIND_MORE && !utf8_valid(p + r.topic_off, r.topic_len)) {
            snprintf(why.text, sizeof why.text, "topic is not UTF-8");
            kind = KIND_CORRUPT;
        }
        if (damaged || kind != KIND_MORE) {
            if (!damaged) {
                if (stop - pos < 8)
                    snprintf(why.text, sizeof why.text, "%zd bytes left, too few for a record",
                             stop - pos);
                else if (kind != KIND_CORRUPT) /* a blank or zeroes: not a message */
                    snprintf(why.text, sizeof why.text, "bad magic code 0x%08X", get_u32(p + 4));
            }
            if (grow((void **)&w->skips, &w->skip_cap, w->n_skips + 1, sizeof(skip_t)) < 0) {
                w->no_memory = 1;
                return;
            }
            w->skips[w->n_skips++] = (skip_t){pos, p, r, why};
            if (!damaged || !report) {
                w->broken = 1;
                return;
            }
            pos += r.size;
            continue;
        }
        /* Offsets are int32: stop before a column could pass 2 GiB. */
        if (w->rows > 0 && w->data[AC_BODY] + r.body_len + r.props_len > INT32_MAX / 2) break;
        uint32_t props_len = shown_props_len(p, &r);
        const uint8_t *block = p + r.props_off;
        if (!utf8_valid(block, props_len)) w->utf8_ok = 0;
        Py_ssize_t count = split_props(block, props_len, &w->props, &w->props_cap);
        if (count < 0 || grow((void **)&w->row, &w->row_cap, w->rows + 1, sizeof *w->row) < 0) {
            w->no_memory = 1;
            return;
        }
        const prop_t *tags = find_pair(w->props, count, "TAGS");
        const prop_t *keys = find_pair(w->props, count, "KEYS");
        w->data[AC_TOPIC] += r.topic_len;
        w->data[AC_MSG_ID] += 2 * msg_id_len(&r);
        w->data[AC_BODY] += r.body_len;
        if (tags) w->data[AC_TAGS] += tags->value_len;
        else w->tags_nulls++;
        if (keys) w->data[AC_KEYS] += keys->value_len;
        else w->keys_nulls++;
        for (Py_ssize_t i = 0; i < count; i++) {
            w->data[AC_PROP_KEYS] += w->props[i].name_len;
            w->data[AC_PROP_VALUES] += w->props[i].value_len;
        }
        w->entries += count;
        w->row[w->rows++] = p;
        pos += r.size;
    }
    w->next_pos = pos;
}

/* A variable-width column's buffers being filled: int32 offsets, data, validity. */
typedef struct {
    int32_t *off;
    uint8_t *data, *valid;
    Py_ssize_t at; /* data bytes so far */
} fill_t;

static void fill_put(fill_t *c, Py_ssize_t row, const uint8_t *s, Py_ssize_t n, int present) {
    if (present) c->valid[row >> 3] |= (uint8_t)(1u << (row & 7));
    if (n > 0) memcpy(c->data + c->at, s, (size_t)n);
    c->at += n;
    c->off[row + 1] = (int32_t)c->at;
}

/* The outputs pass two fills: the PyBytes arrow_columns returns, sized by pass one. */
typedef struct {
    int32_t *queue_id;
    int64_t *queue_offset, *commitlog_offset, *born, *stored;
    int32_t *map_off;
    fill_t col[AC_N];
} out_t;

/* Pass two, without the GIL: the rows pass one found, into their buffers. */
static void fill_rows(walk_t *w, out_t *o) {
    static const char hex[] = "0123456789ABCDEF";
    Py_ssize_t entry = 0;
    o->map_off[0] = 0;
    for (int c = 0; c < AC_N; c++) o->col[c].off[0] = 0;
    for (Py_ssize_t row = 0; row < w->rows; row++) {
        const uint8_t *p = w->row[row];
        rec_t r;
        reason_t why;
        parse_record(p, INT32_MAX, &r, &why); /* pass one framed it */
        o->queue_id[row] = r.queue_id;
        o->queue_offset[row] = r.queue_offset;
        o->commitlog_offset[row] = r.phys;
        o->born[row] = get_i64(p + 40);
        o->stored[row] = r.store_ts;
        fill_put(&o->col[AC_TOPIC], row, p + r.topic_off, r.topic_len, 1);
        Py_ssize_t sh = msg_id_len(&r) - 8;
        uint8_t id[28];
        memcpy(id, p + r.store_ts_off + 8, (size_t)sh);
        put_i64(id + sh, r.phys);
        uint8_t h[2 * sizeof id];
        for (Py_ssize_t i = 0; i < sh + 8; i++) {
            h[2 * i] = (uint8_t)hex[id[i] >> 4];
            h[2 * i + 1] = (uint8_t)hex[id[i] & 15];
        }
        fill_put(&o->col[AC_MSG_ID], row, h, 2 * (sh + 8), 1);
        /* Pass one grew w->props to the most pairs of any row: no allocation here. */
        Py_ssize_t count =
            split_props(p + r.props_off, shown_props_len(p, &r), &w->props, &w->props_cap);
        const prop_t *props = w->props;
        const prop_t *tags = find_pair(props, count, "TAGS");
        const prop_t *keys = find_pair(props, count, "KEYS");
        fill_put(&o->col[AC_TAGS], row, tags ? tags->value : NULL, tags ? tags->value_len : 0,
                 tags != NULL);
        fill_put(&o->col[AC_KEYS], row, keys ? keys->value : NULL, keys ? keys->value_len : 0,
                 keys != NULL);
        fill_put(&o->col[AC_BODY], row, p + r.body_off, r.body_len, 1);
        for (Py_ssize_t i = 0; i < count; i++, entry++) {
            fill_put(&o->col[AC_PROP_KEYS], entry, props[i].name, props[i].name_len, 1);
            fill_put(&o->col[AC_PROP_VALUES], entry, props[i].value, props[i].value_len, 1);
        }
        o->map_off[row + 1] = (int32_t)entry;
    }
}

/* Where arrow_columns' outputs come from: bytes objects, or alloc(n) (a writable
 * buffer of at least n bytes: pyarrow.allocate_buffer, Arrow's memory pool, which
 * keeps freed memory for the next batch where malloc may hand large blocks back to
 * the kernel and fault them in again). views holds the buffers taken of alloc's
 * objects until the fill is done. */
#define AC_OUTPUTS (6 + 3 * AC_N)
typedef struct {
    PyObject *alloc; /* NULL: bytes */
    Py_buffer views[AC_OUTPUTS];
    int n_views;
} outputs_t;

/* A new output of n bytes, zeroed when asked (validity bitmaps); its data at *at.
 * NULL with an error set when the allocation fails. */
static PyObject *new_bytes(outputs_t *outs, Py_ssize_t n, int zero, void *at) {
    if (outs->alloc == NULL) {
        PyObject *b = PyBytes_FromStringAndSize(NULL, n);
        if (b != NULL) {
            if (zero) memset(PyBytes_AS_STRING(b), 0, (size_t)n);
            *(void **)at = PyBytes_AS_STRING(b);
        }
        return b;
    }
    PyObject *b = PyObject_CallFunction(outs->alloc, "n", n);
    if (b == NULL) return NULL;
    Py_buffer *view = &outs->views[outs->n_views];
    if (PyObject_GetBuffer(b, view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(b);
        return NULL;
    }
    outs->n_views++;
    if (view->len < n) {
        PyErr_Format(PyExc_ValueError, "arrow_columns: alloc(%zd) gave %zd bytes", n, view->len);
        Py_DECREF(b);
        return NULL;
    }
    if (zero && n > 0) memset(view->buf, 0, (size_t)n);
    *(void **)at = view->buf;
    return b;
}

/* The buffers of data (a bytes-like object, or a list or tuple of them), each
 * placed after the one before. 0, or -1 with an error set (the views taken so
 * far released). */
static int get_segments(PyObject *data, seg_t **segs, Py_ssize_t *n, Py_ssize_t *total) {
    int many = PyList_Check(data) || PyTuple_Check(data);
    PyObject *seq = many ? PySequence_Fast(data, "arrow_columns: data") : NULL;
    Py_ssize_t count = many ? PySequence_Fast_GET_SIZE(seq) : 1;
    *segs = PyMem_Calloc((size_t)(count ? count : 1), sizeof(seg_t));
    *n = 0;
    *total = 0;
    if (*segs == NULL) {
        Py_XDECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = many ? PySequence_Fast_GET_ITEM(seq, i) : data;
        if (PyObject_GetBuffer(item, &(*segs)[i].view, PyBUF_SIMPLE) < 0) {
            Py_XDECREF(seq);
            return -1;
        }
        (*segs)[i].base = *total;
        *total += (*segs)[i].view.len;
        (*n)++;
    }
    Py_XDECREF(seq);
    return 0;
}

/*
 * arrow_columns(data, pos, end, max_rows, max_bytes, error_type, check_crc=False,
 *               damaged=None, damaged_type=None, alloc=None)
 *   -> (next_pos, rows, utf8_ok, queue_id, queue_offset, commitlog_offset,
 *       born_timestamp, store_timestamp, map_offsets,
 *       (offsets, data, validity, null_count) for topic, msg_id, tags, keys,
 *       property names, property values, body)
 * The records of data[pos:end] (back to back, as a pull returns them) as the
 * buffers of Arrow columns (pipeline._rows.ARROW_SCHEMA), without a Python
 * object per row: fixed-width columns as native-endian int32/int64 arrays,
 * variable ones as int32 offsets + data (+ a validity bitmap; tags and keys are
 * null when the property is absent), properties as a map's entry offsets and
 * its flat names and values. Stops after max_rows records, or once the body
 * bytes reach max_bytes (at least one record), at next_pos. Same validation as
 * decode_records (error_type(position in data, reason) on a bad record; with
 * check_crc, damaged and damaged_type, a record whose checksum fails is left
 * out and reported as decode_records does).
 * data may be a list or tuple of buffers, each holding whole records: then
 * positions are in their concatenation (what b"".join(data) would give), read
 * in place. Two passes, both without the GIL: the first walks and checks the
 * records and sizes every column, the second fills bytes objects of exactly
 * those sizes (each body copied once, no buffer grown).
 * utf8_ok is False when some property block is not UTF-8 (the decoder's
 * errors="replace" would change it): the caller then decodes that range with
 * decode_records. The readable reference is pipeline._rows.record_batch.
 * alloc, when given, makes the outputs in place of bytes objects: alloc(n) must
 * return a writable buffer of at least n bytes (pyarrow.allocate_buffer).
 */
static PyObject *py_arrow_columns(PyObject *self, PyObject *args) {
    PyObject *data;
    Py_ssize_t pos, end, max_rows, max_bytes;
    PyObject *error_type, *damaged = Py_None, *damaged_type = Py_None, *alloc = Py_None;
    int check_crc = 0;
    if (!PyArg_ParseTuple(args, "OnnnnO|pOOO", &data, &pos, &end, &max_rows, &max_bytes,
                          &error_type, &check_crc, &damaged, &damaged_type, &alloc))
        return NULL;
    outputs_t outs;
    outs.alloc = alloc == Py_None ? NULL : alloc;
    outs.n_views = 0;
    PyObject *result = NULL, *parts = NULL;
    seg_t *segs = NULL;
    Py_ssize_t n_segs = 0, total = 0;
    walk_t w;
    memset(&w, 0, sizeof w);
    if (get_segments(data, &segs, &n_segs, &total) < 0) goto done;
    if (pos < 0 || end > total || pos > end) {
        PyErr_SetString(PyExc_ValueError, "arrow_columns: pos/end outside data");
        goto done;
    }
    int report = damaged != NULL && damaged != Py_None;
    Py_BEGIN_ALLOW_THREADS
    walk_records(segs, n_segs, pos, end, max_rows, max_bytes, check_crc, report, &w);
    Py_END_ALLOW_THREADS
    if (w.no_memory) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < w.n_skips; i++) {
        skip_t *k = &w.skips[i];
        if (w.broken && i == w.n_skips - 1) {
            PyObject *err = PyObject_CallFunction(error_type, "ns", k->pos, k->why.text);
            if (err != NULL) {
                PyErr_SetObject((PyObject *)Py_TYPE(err), err);
                Py_DECREF(err);
            }
            goto done;
        }
        if (report_damaged(damaged, damaged_type, error_type, k->pos, k->p, &k->r,
                           k->why.text) < 0)
            goto done;
    }
    Py_ssize_t rows = w.rows;
    out_t o;
    parts = PyTuple_New(9 + AC_N);
    if (parts == NULL) goto done;
    PyTuple_SET_ITEM(parts, 0, PyLong_FromSsize_t(w.next_pos));
    PyTuple_SET_ITEM(parts, 1, PyLong_FromSsize_t(rows));
    PyTuple_SET_ITEM(parts, 2, PyBool_FromLong(w.utf8_ok));
    void *fixed_at[] = {&o.queue_id, &o.queue_offset, &o.commitlog_offset, &o.born, &o.stored,
                        &o.map_off};
    Py_ssize_t fixed_len[] = {rows * 4, rows * 8, rows * 8, rows * 8, rows * 8, (rows + 1) * 4};
    for (int i = 0; i < 6; i++) {
        PyObject *b = new_bytes(&outs, fixed_len[i], 0, fixed_at[i]);
        if (b == NULL) goto done; /* its error is set */
        PyTuple_SET_ITEM(parts, 3 + i, b);
    }
    for (int c = 0; c < AC_N; c++) {
        Py_ssize_t n = (c == AC_PROP_KEYS || c == AC_PROP_VALUES) ? w.entries : rows;
        Py_ssize_t nulls = c == AC_TAGS ? w.tags_nulls : c == AC_KEYS ? w.keys_nulls : 0;
        o.col[c].at = 0;
        PyObject *off = new_bytes(&outs, (n + 1) * 4, 0, &o.col[c].off);
        PyObject *dat = off == NULL ? NULL : new_bytes(&outs, w.data[c], 0, &o.col[c].data);
        PyObject *val = dat == NULL ? NULL : new_bytes(&outs, (n + 7) / 8, 1, &o.col[c].valid);
        if (val == NULL) {
            Py_XDECREF(off);
            Py_XDECREF(dat);
            goto done;
        }
        PyObject *t = Py_BuildValue("(NNNn)", off, dat, val, nulls);
        if (t == NULL) goto done;
        PyTuple_SET_ITEM(parts, 9 + c, t);
    }
    Py_BEGIN_ALLOW_THREADS
    fill_rows(&w, &o);
    Py_END_ALLOW_THREADS
    result = parts;
    parts = NULL;
done:
    Py_XDECREF(parts);
    for (int i = 0; i < outs.n_views; i++) PyBuffer_Release(&outs.views[i]);
    for (Py_ssize_t i = 0; i < n_segs; i++) PyBuffer_Release(&segs[i].view);
    PyMem_Free(segs);
    PyMem_RawFree(w.row);
    PyMem_RawFree(w.skips);
    PyMem_RawFree(w.props);
    return result;
}

static PyMethodDef methods[] = {
    {"crc32", py_crc32, METH_VARARGS, "crc32(data, start=0) -> zlib-compatible CRC32."},
    {"crc32_portable", py_crc32_portable, METH_VARARGS,
     "crc32_portable(data, start=0) -> the table-driven CRC32 (the fallback, for tests)."},
    {"tags_code_at", py_tags_code_at, METH_VARARGS,
     "tags_code_at(buf, pos) -> the ConsumeQueue tagsCode of the record at pos, or None."},
    {"crc32_combine", py_crc32_combine, METH_VARARGS,
     "crc32_combine(crc1, crc2, len2) -> zlib's crc32_combine: the CRC of A||B."},
    {"scan", py_scan, METH_VARARGS,
     "scan(buf, pos, limit, base_offset, check_crc, newer_than_ms) -> "
     "(pos, kind, reason, last_store_ts, first_newer_pos, count)."},
    {"dispatch", py_dispatch, METH_VARARGS,
     "dispatch(fd, file_pos, avail, base_offset, window, want_records, topic_cache) -> "
     "(pos, kind, reason, consumed, last_store_ts, runs, records, need)."},
    {"stamp", py_stamp, METH_VARARGS,
     "stamp(buf, start, end, base_phys, queue_offset, store_ts, store_host, topic, queue_id, "
     "max_body_size, refuse_transactional=False) -> "
     "(next_queue_offset, physical_offsets, queue_offsets, sizes, units)."},
    {"gather", py_gather, METH_VARARGS,
     "gather(units, i, n, log, log_base, log_end, count, total, max_nums, in_memory_from, "
     "mem_bytes, mem_count, disk_bytes, disk_count, codes, confirm, out) -> "
     "(i, count, total, stop)."},
    {"index_put", py_index_put, METH_VARARGS,
     "index_put(log, pos, limit, base_phys, index_mm, hash_slot_num, index_num, state, "
     "skip_keys) -> (pos, keys_done, state, stop, reason)."},
    {"index_check", py_index_check, METH_VARARGS,
     "index_check(index_mm, hash_slot_num, index_num, index_count, begin_phy, end_phy) -> "
     "what is wrong with the written slots and entries, or ''."},
    {"decode_records", py_decode_records, METH_VARARGS,
     "decode_records(data, record_type, decode_host, error_type, check_crc=False, damaged=None, "
     "damaged_type=None) -> list of record_type."},
    {"slotted", py_slotted, METH_VARARGS,
     "slotted(cls, fields, columns) -> [cls instance k: fields[i] = columns[i][k]]."},
    {"encode_batch", py_encode_batch, METH_VARARGS,
     "encode_batch(messages, uniq_keys, queue_id, store_host, born_timestamp_ms, "
     "message_type, host_parts) -> bytes, or None: use common.record.encode_batch_py."},
    {"arrow_columns", py_arrow_columns, METH_VARARGS,
     "arrow_columns(data, pos, end, max_rows, max_bytes, error_type, check_crc=False, "
     "damaged=None, damaged_type=None, alloc=None) -> the buffers of "
     "pipeline._rows.ARROW_SCHEMA's columns for the records of data[pos:end] (data: a "
     "buffer, or a list or tuple of buffers read as their concatenation)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "basalt.common._records",
                                    "The CommitLog's per-record loops in C.", -1, methods};

PyMODINIT_FUNC PyInit__records(void) {
    crc_init();
#ifdef HAVE_CLMUL_PATH
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    crc_combine_init();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "KIND_MORE", KIND_MORE) < 0 ||
        PyModule_AddIntConstant(m, "KIND_END", KIND_END) < 0 ||
        PyModule_AddIntConstant(m, "KIND_BLANK", KIND_BLANK) < 0 ||
        PyModule_AddIntConstant(m, "KIND_CORRUPT", KIND_CORRUPT) < 0 ||
        PyModule_AddIntConstant(m, "GATHER_DONE", GATHER_DONE) < 0 ||
        PyModule_AddIntConstant(m, "GATHER_FULL", GATHER_FULL) < 0 ||
        PyModule_AddIntConstant(m, "GATHER_ELSEWHERE", GATHER_ELSEWHERE) < 0 ||
        PyModule_AddIntConstant(m, "GATHER_CONFIRM", GATHER_CONFIRM) < 0 ||
        PyModule_AddIntConstant(m, "INDEX_DONE", INDEX_DONE) < 0 ||
        PyModule_AddIntConstant(m, "INDEX_FULL", INDEX_FULL) < 0 ||
        PyModule_AddIntConstant(m, "INDEX_BLANK", INDEX_BLANK) < 0 ||
        PyModule_AddIntConstant(m, "INDEX_CORRUPT", INDEX_CORRUPT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *fields = PyTuple_New(N_RECORD_FIELDS);
    for (int i = 0; fields != NULL && i < N_RECORD_FIELDS; i++) {
        PyObject *name = PyUnicode_InternFromString(RECORD_FIELDS[i]);
        if (name == NULL) Py_CLEAR(fields);
        else PyTuple_SET_ITEM(fields, i, name);
    }
    if (fields == NULL || PyModule_AddObject(m, "RECORD_FIELDS", fields) < 0) {
        Py_XDECREF(fields);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
