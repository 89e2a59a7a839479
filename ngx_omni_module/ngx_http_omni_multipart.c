
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_multipart.c -- multipart/form-data (RFC 7578, RFC 2046
 * section 5.1) parsed as the body arrives. No I/O.
 *
 * The body is fed in pieces split anywhere (one byte at a time is as
 * good as one piece), and the state lives in ngx_http_omni_mp_t between
 * them, like nginx's own parsers. The delimiter is "\r\n--" and the
 * boundary; the body's first one has no CRLF before it, so the parser
 * starts as if two bytes "\r\n" had been seen. Scanning for it is binary
 * safe: part data may hold any byte, "\r\n--" and prefixes of the
 * boundary included. Since '\r' is the delimiter's first byte and none of
 * the others (a boundary has no CR), a mismatch after k matched bytes
 * can only start a new match at the byte at hand: the k bytes were data,
 * and they are the delimiter's own first k, so nothing needs to be held
 * back across pieces. Outside a possible match the data runs to the next
 * '\r' (memchr), so a large file part costs little more than a memchr.
 *
 * After a delimiter: "--" ends the body (the epilogue is ignored), or
 * optional spaces and tabs and CRLF start a part: header lines ending in
 * CRLF (at most NGX_HTTP_OMNI_MP_LINES of NGX_HTTP_OMNI_MP_LINE bytes),
 * an empty line, the data. Content-Disposition must be form-data with a
 * name; name and filename may be quoted ("\"" escapes a quote, other
 * backslashes are the name's own: .NET sends Windows paths unescaped) or
 * bare tokens; filename* (RFC 5987, percent-encoded) wins over filename.
 * Other headers (Content-Type and the like) are read and ignored.
 *
 * Memory: two buffers of NGX_HTTP_OMNI_MP_LINE (a header line; the
 * current part's name and filename), the file part's filename, and the
 * values of the parts the caller keeps (at most NGX_HTTP_OMNI_MP_KEPT
 * bytes in at most NGX_HTTP_OMNI_MP_FIELDS parts), whatever the number
 * of parts. Of the file part only its offsets are kept; its bytes are
 * wherever the caller's buffers put them.
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_omni_multipart.h"


static ngx_int_t ngx_http_omni_mp_delimiter(ngx_http_omni_mp_t *mp,
    off_t at);
static ngx_int_t ngx_http_omni_mp_headers_end(ngx_http_omni_mp_t *mp,
    off_t at);
static ngx_int_t ngx_http_omni_mp_header(ngx_http_omni_mp_t *mp);
static ngx_int_t ngx_http_omni_mp_disposition(ngx_http_omni_mp_t *mp,
    u_char *p, u_char *last);
static u_char *ngx_http_omni_mp_value(u_char *p, u_char *last,
    ngx_str_t *value, u_char *buf);
static ngx_int_t ngx_http_omni_mp_ext_value(ngx_str_t *value);
static void ngx_http_omni_mp_basename(ngx_str_t *name);
static ngx_int_t ngx_http_omni_mp_data(ngx_http_omni_mp_t *mp, u_char *p,
    size_t n);
static ngx_int_t ngx_http_omni_mp_fail(ngx_http_omni_mp_t *mp,
    const char *error, ngx_str_t *param);


/* Content-Type: multipart/form-data; boundary=B */

ngx_int_t
ngx_http_omni_mp_boundary(ngx_str_t *content_type, ngx_str_t *boundary)
{
    u_char  *p, *last, *start;

    static u_char  type[] = "multipart/form-data";

    p = content_type->data;
    last = p + content_type->len;

    if (content_type->len < sizeof(type) - 1
        || ngx_strncasecmp(p, type, sizeof(type) - 1) != 0)
    {
        return NGX_DECLINED;
    }

    p += sizeof(type) - 1;

    if (p < last && *p != ';' && *p != ' ' && *p != '\t') {
        return NGX_DECLINED;
    }

    /* parameters: ; name=value, the value a token or a quoted string */

    for ( ;; ) {

        while (p < last && (*p == ' ' || *p == '\t' || *p == ';')) {
            p++;
        }

        if (p == last) {
            return NGX_ABORT;
        }

        start = p;

        while (p < last && *p != '=' && *p != ';') {
            p++;
        }

        if (p == last || *p == ';') {
            continue;
        }

        if (p - start == sizeof("boundary") - 1
            && ngx_strncasecmp(start, (u_char *) "boundary",
                               sizeof("boundary") - 1) == 0)
        {
            break;
        }

        /* another parameter: skip its value */

        p++;

        if (p < last && *p == '"') {
            for (p++; p < last && *p != '"'; p++) { /* void */ }

            if (p < last) {
                p++;
            }
        }

        while (p < last && *p != ';') {
            p++;
        }
    }

    p++;

    if (p < last && *p == '"') {
        start = ++p;

        while (p < last && *p != '"') {
            p++;
        }

        if (p == last) {
            return NGX_ABORT;
        }

    } else {
        start = p;

        while (p < last && *p != ';' && *p != ' ' && *p != '\t') {
            p++;
        }
    }

    boundary->data = start;
    boundary->len = p - start;

    if (boundary->len == 0 || boundary->len > NGX_HTTP_OMNI_MP_BOUNDARY) {
        return NGX_ABORT;
    }

    return NGX_OK;
}


ngx_http_omni_mp_t *
ngx_http_omni_mp_create(ngx_pool_t *pool, ngx_str_t *boundary,
    ngx_str_t *keep, ngx_str_t *file_name)
{
    u_char              *p;
    ngx_http_omni_mp_t  *mp;

    mp = ngx_pcalloc(pool, sizeof(ngx_http_omni_mp_t));
    if (mp == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     mp->state = ngx_http_omni_mp_st_data;
     *     mp->offset = 0;
     *     mp->part = ngx_http_omni_mp_skip;
     *     mp->done = 0;
     *     mp->file = 0;
     *     mp->error = NULL;
     */

    p = ngx_pnalloc(pool, sizeof("\r\n--") - 1 + boundary->len);
    if (p == NULL) {
        return NULL;
    }

    mp->delimiter.data = p;
    mp->delimiter.len = sizeof("\r\n--") - 1 + boundary->len;

    p = ngx_cpymem(p, "\r\n--", sizeof("\r\n--") - 1);
    ngx_memcpy(p, boundary->data, boundary->len);

    mp->line = ngx_pnalloc(pool, 2 * NGX_HTTP_OMNI_MP_LINE);
    if (mp->line == NULL) {
        return NULL;
    }

    mp->names = mp->line + NGX_HTTP_OMNI_MP_LINE;

    if (ngx_array_init(&mp->fields, pool, 8, sizeof(ngx_http_omni_mp_field_t))
        != NGX_OK)
    {
        return NULL;
    }

    mp->pool = pool;
    mp->keep = keep;
    mp->file_name = *file_name;

    /* the first delimiter has no CRLF before it: as if it had been seen */

    mp->matched = 2;
    mp->preamble = 1;

    return mp;
}


ngx_int_t
ngx_http_omni_mp_parse(ngx_http_omni_mp_t *mp, u_char *p, u_char *last)
{
    u_char     c, *start, *q;
    off_t      base;
    ngx_int_t  rc;

    if (mp->error) {
        return NGX_DECLINED;
    }

    start = p;
    base = mp->offset;
    rc = NGX_OK;

    for ( /* void */ ; p < last; p++) {

        c = *p;

        switch (mp->state) {

        case ngx_http_omni_mp_st_data:

            if (mp->matched == 0) {

                /* data up to the next CR, which may start the delimiter */

                q = ngx_strlchr(p, last, '\r');

                if (q == NULL) {
                    rc = ngx_http_omni_mp_data(mp, p, last - p);
                    p = last - 1;
                    break;
                }

                if (q > p) {
                    rc = ngx_http_omni_mp_data(mp, p, q - p);

                    if (rc != NGX_OK) {
                        break;
                    }
                }

                p = q;
                mp->matched = 1;
                break;
            }

            if (c == mp->delimiter.data[mp->matched]) {

                if (++mp->matched == mp->delimiter.len) {
                    rc = ngx_http_omni_mp_delimiter(mp, base + (p - start)
                                                    + 1 - mp->delimiter.len);
                }

                break;
            }

            /* the bytes matched were data, and c starts a match or not */

            rc = ngx_http_omni_mp_data(mp, mp->delimiter.data, mp->matched);

            if (c == '\r') {
                mp->matched = 1;

            } else {
                mp->matched = 0;

                if (rc == NGX_OK) {
                    rc = ngx_http_omni_mp_data(mp, p, 1);
                }
            }

            break;

        case ngx_http_omni_mp_st_after_boundary:

            switch (c) {
            case '-':
                mp->state = ngx_http_omni_mp_st_close;
                break;
            case ' ':
            case '\t':
                mp->state = ngx_http_omni_mp_st_padding;
                break;
            case '\r':
                mp->state = ngx_http_omni_mp_st_padding_lf;
                break;
            default:
                rc = ngx_http_omni_mp_fail(mp, "a boundary is followed by "
                                           "something other than CRLF or "
                                           "\"--\"", NULL);
            }

            break;

        case ngx_http_omni_mp_st_close:

            if (c != '-') {
                rc = ngx_http_omni_mp_fail(mp, "a boundary is followed by "
                                           "something other than CRLF or "
                                           "\"--\"", NULL);
                break;
            }

            mp->done = 1;
            mp->state = ngx_http_omni_mp_st_epilogue;
            break;

        case ngx_http_omni_mp_st_padding:

            if (c == ' ' || c == '\t') {
                break;
            }

            if (c == '\r') {
                mp->state = ngx_http_omni_mp_st_padding_lf;
                break;
            }

            rc = ngx_http_omni_mp_fail(mp, "a boundary is followed by "
                                       "something other than CRLF or "
                                       "\"--\"", NULL);
            break;

        case ngx_http_omni_mp_st_padding_lf:

            if (c != '\n') {
                rc = ngx_http_omni_mp_fail(mp, "a boundary line does not end "
                                           "in CRLF", NULL);
                break;
            }

            /* a part begins: its headers */

            mp->parts++;
            mp->part = ngx_http_omni_mp_skip;
            mp->field = NULL;
            mp->line_len = 0;
            mp->lines = 0;
            mp->disposition = 0;
            ngx_str_null(&mp->name);
            ngx_str_null(&mp->filename);

            mp->state = ngx_http_omni_mp_st_header;
            break;

        case ngx_http_omni_mp_st_header:

            if (c == '\r') {
                mp->state = ngx_http_omni_mp_st_header_lf;
                break;
            }

            if (c == '\n') {
                rc = ngx_http_omni_mp_fail(mp, "a part's header line does "
                                           "not end in CRLF", NULL);
                break;
            }

            if (mp->line_len == NGX_HTTP_OMNI_MP_LINE) {
                rc = ngx_http_omni_mp_fail(mp, "a part's header line is too "
                                           "long", NULL);
                break;
            }

            mp->line[mp->line_len++] = c;
            break;

        case ngx_http_omni_mp_st_header_lf:

            if (c != '\n') {
                rc = ngx_http_omni_mp_fail(mp, "a part's header line does "
                                           "not end in CRLF", NULL);
                break;
            }

            if (mp->line_len == 0) {
                rc = ngx_http_omni_mp_headers_end(mp, base + (p - start) + 1);
                break;
            }

            if (++mp->lines > NGX_HTTP_OMNI_MP_LINES) {
                rc = ngx_http_omni_mp_fail(mp, "a part has too many header "
                                           "lines", NULL);
                break;
            }

            rc = ngx_http_omni_mp_header(mp);
            mp->line_len = 0;
            mp->state = ngx_http_omni_mp_st_header;
            break;

        case ngx_http_omni_mp_st_epilogue:

            /* after the close delimiter: ignored, all of it */

            p = last - 1;
            break;
        }

        if (rc != NGX_OK) {
            return rc;
        }
    }

    mp->offset = base + (last - start);

    return NGX_OK;
}


ngx_int_t
ngx_http_omni_mp_end(ngx_http_omni_mp_t *mp)
{
    if (mp->error) {
        return NGX_DECLINED;
    }

    if (!mp->done) {
        return ngx_http_omni_mp_fail(mp, "the body ends before its closing "
                                     "boundary", NULL);
    }

    return NGX_OK;
}


/* A whole delimiter, which starts at body offset at: the end of the part
 * before it (or of the preamble). */

static ngx_int_t
ngx_http_omni_mp_delimiter(ngx_http_omni_mp_t *mp, off_t at)
{
    mp->matched = 0;
    mp->state = ngx_http_omni_mp_st_after_boundary;

    if (mp->preamble) {
        mp->preamble = 0;
        return NGX_OK;
    }

    if (mp->part == ngx_http_omni_mp_file) {
        mp->file = 1;
        mp->file_end = at;
    }

    mp->part = ngx_http_omni_mp_skip;
    mp->field = NULL;

    return NGX_OK;
}


/* The empty line after a part's headers; its data starts at body offset
 * at. */

static ngx_int_t
ngx_http_omni_mp_headers_end(ngx_http_omni_mp_t *mp, off_t at)
{
    ngx_str_t                 *k;
    ngx_http_omni_mp_field_t  *f;

    if (!mp->disposition) {
        return ngx_http_omni_mp_fail(mp, "a part has no Content-Disposition "
                                     "header", NULL);
    }

    if (mp->name.len == 0) {
        return ngx_http_omni_mp_fail(mp, "a part has no name", NULL);
    }

    mp->state = ngx_http_omni_mp_st_data;
    mp->matched = 0;

    if (mp->name.len == mp->file_name.len
        && ngx_strncmp(mp->name.data, mp->file_name.data, mp->name.len) == 0)
    {
        if (mp->file || mp->part == ngx_http_omni_mp_file) {
            return ngx_http_omni_mp_fail(mp, "there is more than one file "
                                         "part", &mp->file_name);
        }

        mp->part = ngx_http_omni_mp_file;
        mp->file_start = at;

        /* the one filename kept: mp->names is the next part's */

        mp->file_filename.len = mp->filename.len;
        mp->file_filename.data = ngx_pstrdup(mp->pool, &mp->filename);

        if (mp->filename.len && mp->file_filename.data == NULL) {
            return NGX_ERROR;
        }

        return NGX_OK;
    }

    for (k = mp->keep; k->len; k++) {
        if (k->len == mp->name.len
            && ngx_strncmp(k->data, mp->name.data, k->len) == 0)
        {
            break;
        }
    }

    if (k->len == 0) {
        mp->part = ngx_http_omni_mp_skip;
        return NGX_OK;
    }

    if (mp->fields.nelts == NGX_HTTP_OMNI_MP_FIELDS) {
        return ngx_http_omni_mp_fail(mp, "the body has too many parts",
                                     NULL);
    }

    f = ngx_array_push(&mp->fields);
    if (f == NULL) {
        return NGX_ERROR;
    }

    f->name = *k;
    ngx_str_null(&f->value);
    f->size = 0;

    mp->field = f;
    mp->part = ngx_http_omni_mp_keep;

    return NGX_OK;
}


/* One header line of a part, in mp->line: Content-Disposition is read,
 * the others are not. */

static ngx_int_t
ngx_http_omni_mp_header(ngx_http_omni_mp_t *mp)
{
    u_char  *p, *last, *colon;

    static u_char  cd[] = "content-disposition";

    p = mp->line;
    last = p + mp->line_len;

    colon = ngx_strlchr(p, last, ':');

    if (colon == NULL || colon == p) {
        return ngx_http_omni_mp_fail(mp, "a part's header line has no name",
                                     NULL);
    }

    if (colon - p != sizeof(cd) - 1
        || ngx_strncasecmp(p, cd, sizeof(cd) - 1) != 0)
    {
        return NGX_OK;
    }

    return ngx_http_omni_mp_disposition(mp, colon + 1, last);
}


/*
 * form-data; name="model"; filename="a.wav"; filename*=utf-8''a.wav
 * The name and the filename are copied into mp->names (mp->line is
 * reused for the next header line), which the next part reuses: a body
 * of many parts costs no more memory than one of a few.
 */

static ngx_int_t
ngx_http_omni_mp_disposition(ngx_http_omni_mp_t *mp, u_char *p,
    u_char *last)
{
    u_char     *start, *buf;
    ngx_str_t   key, value, name, filename, ext;

    static u_char  form_data[] = "form-data";

    while (p < last && (*p == ' ' || *p == '\t')) {
        p++;
    }

    if (last - p < (ssize_t) sizeof(form_data) - 1
        || ngx_strncasecmp(p, form_data, sizeof(form_data) - 1) != 0)
    {
        return ngx_http_omni_mp_fail(mp, "a part's Content-Disposition is "
                                     "not form-data", NULL);
    }

    p += sizeof(form_data) - 1;

    /* the values, unquoted, fit in the line's bytes */

    buf = mp->names;

    ngx_str_null(&name);
    ngx_str_null(&filename);
    ngx_str_null(&ext);

    for ( ;; ) {

        while (p < last && (*p == ' ' || *p == '\t')) {
            p++;
        }

        if (p == last) {
            break;
        }

        if (*p != ';') {
            return ngx_http_omni_mp_fail(mp, "a part's Content-Disposition "
                                         "is malformed", NULL);
        }

        p++;

        while (p < last && (*p == ' ' || *p == '\t')) {
            p++;
        }

        start = p;

        while (p < last && *p != '=' && *p != ';' && *p != ' '
               && *p != '\t')
        {
            p++;
        }

        key.data = start;
        key.len = p - start;

        while (p < last && (*p == ' ' || *p == '\t')) {
            p++;
        }

        if (p == last || *p != '=') {

            /* a parameter without a value: nothing of ours */

            continue;
        }

        p = ngx_http_omni_mp_value(p + 1, last, &value, buf);

        if (p == NULL) {
            return ngx_http_omni_mp_fail(mp, "a part's Content-Disposition "
                                         "has an unterminated quoted "
                                         "string", NULL);
        }

        buf += value.len;

        if (key.len == 4 && ngx_strncasecmp(key.data, (u_char *) "name", 4)
                            == 0)
        {
            name = value;

        } else if (key.len == 8
                   && ngx_strncasecmp(key.data, (u_char *) "filename", 8)
                      == 0)
        {
            filename = value;

        } else if (key.len == 9
                   && ngx_strncasecmp(key.data, (u_char *) "filename*", 9)
                      == 0)
        {
            ext = value;
        }
    }

    if (ext.len && ngx_http_omni_mp_ext_value(&ext) == NGX_OK) {
        filename = ext;
    }

    ngx_http_omni_mp_basename(&filename);

    mp->disposition = 1;
    mp->name = name;
    mp->filename = filename;

    return NGX_OK;
}


/* A parameter's value at p, a quoted string or a token, copied into buf
 * (unquoted); returns where it ends, NULL for an unterminated quote. */

static u_char *
ngx_http_omni_mp_value(u_char *p, u_char *last, ngx_str_t *value,
    u_char *buf)
{
    u_char  *d;

    while (p < last && (*p == ' ' || *p == '\t')) {
        p++;
    }

    d = buf;

    if (p < last && *p == '"') {

        for (p++; p < last && *p != '"'; p++) {

            /* \" is a quote; other backslashes are the value's own */

            if (*p == '\\' && p + 1 < last && p[1] == '"') {
                p++;
            }

            *d++ = *p;
        }

        if (p == last) {
            return NULL;
        }

        p++;

    } else {
        while (p < last && *p != ';') {
            *d++ = *p++;
        }

        while (d > buf && (d[-1] == ' ' || d[-1] == '\t')) {
            d--;
        }
    }

    value->data = buf;
    value->len = d - buf;

    /* a quoted string may be followed by spaces only, up to the next ";"
     * (the caller checks) */

    return p;
}


/* filename*=charset'language'percent-encoded (RFC 5987), decoded in
 * place; NGX_DECLINED when it is not that. */

static ngx_int_t
ngx_http_omni_mp_ext_value(ngx_str_t *value)
{
    u_char      *p, *last, *d, c, h;
    ngx_uint_t   i;

    p = value->data;
    last = p + value->len;

    p = ngx_strlchr(p, last, '\'');
    if (p == NULL) {
        return NGX_DECLINED;
    }

    p = ngx_strlchr(p + 1, last, '\'');
    if (p == NULL) {
        return NGX_DECLINED;
    }

    p++;
    d = value->data;

    while (p < last) {

        if (*p != '%') {
            *d++ = *p++;
            continue;
        }

        if (last - p < 3) {
            return NGX_DECLINED;
        }

        c = 0;

        for (i = 1; i <= 2; i++) {
            h = p[i];

            if (h >= '0' && h <= '9') {
                c = (u_char) (c * 16 + (h - '0'));

            } else if ((h | 0x20) >= 'a' && (h | 0x20) <= 'f') {
                c = (u_char) (c * 16 + ((h | 0x20) - 'a' + 10));

            } else {
                return NGX_DECLINED;
            }
        }

        *d++ = c;
        p += 3;
    }

    value->len = d - value->data;

    return NGX_OK;
}


/* The text after the last '/' or '\' of a filename: a client may send a
 * path ("Assets\audio.mp3"). */

static void
ngx_http_omni_mp_basename(ngx_str_t *name)
{
    u_char  *p;

    for (p = name->data + name->len; p > name->data; p--) {
        if (p[-1] == '/' || p[-1] == '\\') {
            name->len -= p - name->data;
            name->data = p;
            return;
        }
    }
}


/* n bytes of the current part's data: kept, or not. */

static ngx_int_t
ngx_http_omni_mp_data(ngx_http_omni_mp_t *mp, u_char *p, size_t n)
{
    u_char                    *v;
    size_t                     size;
    ngx_http_omni_mp_field_t  *f;

    if (mp->part != ngx_http_omni_mp_keep || n == 0) {
        return NGX_OK;
    }

    f = mp->field;

    if (mp->kept + n > NGX_HTTP_OMNI_MP_KEPT) {
        return ngx_http_omni_mp_fail(mp, "a part's value is too long",
                                     &f->name);
    }

    if (f->value.len + n > f->size) {
        size = ngx_max(ngx_max(2 * f->size, f->value.len + n), 64);

        v = ngx_pnalloc(mp->pool, size);
        if (v == NULL) {
            return NGX_ERROR;
        }

        if (f->value.len) {
            ngx_memcpy(v, f->value.data, f->value.len);
        }

        f->value.data = v;
        f->size = size;
    }

    ngx_memcpy(f->value.data + f->value.len, p, n);
    f->value.len += n;
    mp->kept += n;

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_mp_fail(ngx_http_omni_mp_t *mp, const char *error,
    ngx_str_t *param)
{
    mp->error = error;

    if (param) {
        mp->param = *param;
    }

    return NGX_DECLINED;
}
