
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_multipart.h -- the multipart/form-data parser
 * (ngx_http_omni_multipart.c) and its results, for the transcription
 * endpoint (ngx_http_omni_transcribe.c). No I/O: bytes go in as they
 * arrive, in pieces split anywhere; the parser keeps the values of the
 * parts it is told to keep (bounded) and only the offsets of the file
 * part's bytes, which stay where nginx put them (memory or its temporary
 * file).
 */


#ifndef _NGX_HTTP_OMNI_MULTIPART_H_INCLUDED_
#define _NGX_HTTP_OMNI_MULTIPART_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>


#define NGX_HTTP_OMNI_MP_BOUNDARY   200         /* longest boundary taken;
                                                   RFC 2046 allows 70 */
#define NGX_HTTP_OMNI_MP_LINE       4096        /* one part header line */
#define NGX_HTTP_OMNI_MP_LINES      16          /* header lines of a part */
#define NGX_HTTP_OMNI_MP_KEPT       65536       /* kept values, all parts */
#define NGX_HTTP_OMNI_MP_FIELDS     64          /* kept parts */


/* one kept text part */
typedef struct {
    ngx_str_t                   name;
    ngx_str_t                   value;
    size_t                      size;       /* value's buffer */
} ngx_http_omni_mp_field_t;


typedef enum {
    ngx_http_omni_mp_st_data = 0,           /* preamble or a part's data,
                                               looking for the delimiter */
    ngx_http_omni_mp_st_after_boundary,     /* "--" or padding, CRLF */
    ngx_http_omni_mp_st_close,              /* the second "-" of "--" */
    ngx_http_omni_mp_st_padding,            /* LWSP before the CRLF */
    ngx_http_omni_mp_st_padding_lf,
    ngx_http_omni_mp_st_header,             /* a part's header line */
    ngx_http_omni_mp_st_header_lf,
    ngx_http_omni_mp_st_epilogue            /* after the close delimiter */
} ngx_http_omni_mp_state_e;


typedef enum {
    ngx_http_omni_mp_skip = 0,              /* a part nobody asked for */
    ngx_http_omni_mp_keep,                  /* its value is kept */
    ngx_http_omni_mp_file                   /* the file: offsets only */
} ngx_http_omni_mp_part_e;


typedef struct {
    ngx_pool_t                 *pool;
    ngx_str_t                   delimiter;  /* "\r\n--" boundary */
    ngx_str_t                  *keep;       /* names whose values are kept,
                                               ending with a null string */
    ngx_str_t                   file_name;  /* the file part's name */

    /* parser state */
    ngx_http_omni_mp_state_e    state;
    size_t                      matched;    /* delimiter bytes matched */
    off_t                       offset;     /* body bytes parsed */
    ngx_http_omni_mp_part_e     part;
    ngx_http_omni_mp_field_t   *field;      /* the kept part being read */
    u_char                     *line;       /* NGX_HTTP_OMNI_MP_LINE */
    u_char                     *names;      /* the same: the part's name
                                               and filename, unquoted */
    size_t                      line_len;
    ngx_uint_t                  lines;
    ngx_str_t                   name;       /* of the part being read */
    ngx_str_t                   filename;
    size_t                      kept;       /* bytes of kept values */
    unsigned                    preamble:1;
    unsigned                    disposition:1;
    unsigned                    done:1;     /* close delimiter seen */

    /* what was found */
    ngx_array_t                 fields;     /* ngx_http_omni_mp_field_t */
    ngx_uint_t                  parts;
    unsigned                    file:1;     /* the file part is whole */
    ngx_str_t                   file_filename;
                                            /* its filename, the text after
                                               the last '/' or '\' */
    off_t                       file_start; /* its bytes in the body */
    off_t                       file_end;

    /* the first mistake: a 400 */
    const char                 *error;      /* static words; NULL: none */
    ngx_str_t                   param;      /* the part it is in, or empty */
} ngx_http_omni_mp_t;


/* The boundary of a Content-Type: multipart/form-data; boundary=B (B bare
 * or quoted), a view into content_type. NGX_OK; NGX_DECLINED: not
 * multipart/form-data; NGX_ABORT: no usable boundary. */
ngx_int_t ngx_http_omni_mp_boundary(ngx_str_t *content_type,
    ngx_str_t *boundary);

/* A parser for a body of that boundary, from pool: the values of the
 * parts named in keep are kept, the part named file_name is the file.
 * NULL: no memory. */
ngx_http_omni_mp_t *ngx_http_omni_mp_create(ngx_pool_t *pool,
    ngx_str_t *boundary, ngx_str_t *keep, ngx_str_t *file_name);

/* The next bytes of the body. NGX_OK; NGX_DECLINED: the body is not
 * valid multipart/form-data (mp->error says why, mp->param where), feed
 * it no more; NGX_ERROR: no memory. */
ngx_int_t ngx_http_omni_mp_parse(ngx_http_omni_mp_t *mp, u_char *p,
    u_char *last);

/* The body is over: NGX_OK when its close delimiter was seen, else
 * NGX_DECLINED with mp->error set. */
ngx_int_t ngx_http_omni_mp_end(ngx_http_omni_mp_t *mp);


#endif /* _NGX_HTTP_OMNI_MULTIPART_H_INCLUDED_ */
