/* json_scan.h -- the bounds a request body must keep before yajl sees it.
 *
 * Shared, as it is, by the engine (engine/request.c) and the nginx module
 * (ngx_omni_module/ngx_http_omni_request.c): both parse bodies with
 * yajl_tree_parse, and yajl 2.1 sets none of these bounds itself.
 *
 *   depth   yajl has no nesting limit and yajl_tree_free recurses: a
 *           million levels of "[" (2 MB) parse, then overflow the stack
 *           when freed.
 *   nodes   a tree node costs one or two mallocs (~50-90 bytes) for as
 *           little as two input bytes ("1,"): counting the structural
 *           characters and strings bounds the tree whatever the input.
 *   NUL     yajl_tree_parse takes a C string and would accept the valid
 *           prefix before a raw NUL byte.
 *   \u0000  the tree's strings are NUL-terminated without a length, so the
 *           text would be cut silently.
 *   comment yajl_tree_parse turns yajl_allow_comments on; JSON has none.
 *
 * One pass over the raw bytes, tracking strings the way the JSON lexer
 * does; O(len), no allocation. Brackets that do not match are left to yajl
 * to report. Header-only so that the module needs nothing from the engine
 * but headers. */

#ifndef OMNI_JSON_SCAN_H
#define OMNI_JSON_SCAN_H

#include <stddef.h>
#include <string.h>

typedef enum {
    OMNI_JSON_OK = 0,
    OMNI_JSON_NUL,              // a raw NUL byte
    OMNI_JSON_U0000,            // "\u0000" inside a string
    OMNI_JSON_COMMENT,          // '/' outside a string
    OMNI_JSON_DEEP,             // nesting deeper than max_depth
    OMNI_JSON_NODES,            // more than max_nodes values
} OmniJsonScan;

/* Scans len bytes of s; on a refusal *at is the offset where it was seen. */
static inline OmniJsonScan omni_json_scan(const char *s, size_t len,
                                          int max_depth, size_t max_nodes,
                                          size_t *at)
{
    size_t nodes = 0;
    int    depth = 0, in_str = 0, esc = 0;

    for (size_t i = 0; i < len; i++) {
        char c = s[i];

        *at = i;
        if (c == '\0') return OMNI_JSON_NUL;
        if (in_str) {
            if (esc) {
                esc = 0;
                if (c == 'u' && len - i > 4
                    && memcmp(s + i + 1, "0000", 4) == 0)
                {
                    return OMNI_JSON_U0000;
                }
            } else if (c == '\\') {
                esc = 1;
            } else if (c == '"') {
                in_str = 0;
            }
            continue;
        }
        switch (c) {
        case '/':
            return OMNI_JSON_COMMENT;
        case '[':
        case '{':
            if (++depth > max_depth) return OMNI_JSON_DEEP;
            break;
        case ']':
        case '}':
            depth--;
            continue;
        case '"':
            in_str = 1;
            break;
        case ',':
        case ':':
            break;
        default:
            continue;
        }
        if (++nodes > max_nodes) return OMNI_JSON_NODES;
    }
    return OMNI_JSON_OK;
}

#endif
