
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_auth.c -- API keys: the omni_api_keys file, read when the
 * configuration is, and the "Authorization: Bearer" check of each
 * request, in time that does not tell where a key differs. Apart from
 * the handler (ngx_http_omni_module.c) because a key is a secret: this is
 * the one file that reads one, and nothing here logs or echoes it; what
 * leaves it is the key for the limits to hash at once, or its tenant's
 * name, a hash already.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <ngx_sha1.h>

#include "ngx_http_omni_module.h"


#define NGX_HTTP_OMNI_KEYS_MAX_SIZE  (1024 * 1024)


static ngx_int_t ngx_http_omni_unauthorized(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, char *message, char *code);
static void ngx_http_omni_bearer(ngx_http_request_t *r, ngx_str_t *token);
static ngx_uint_t ngx_http_omni_key_known(ngx_http_omni_loc_conf_t *olcf,
    ngx_str_t *token);
static ngx_uint_t ngx_http_omni_key_equal(ngx_str_t *token, ngx_str_t *key);


/*
 * "Authorization: Bearer KEY" against omni_api_keys: every key is
 * compared, each in time that does not depend on where the bytes differ.
 * NGX_OK; NGX_DECLINED with err filled (a 401, WWW-Authenticate added);
 * NGX_ERROR when memory ran out, err left as it was: a server fault, not
 * a refused key (nginx's allocator has logged it, at emerg).
 *
 * Neither the header nor the key is ever logged, at any level, nor
 * echoed in the error. (nginx itself logs a duplicate Authorization line,
 * a header line it cannot parse and one over large_client_header_buffers
 * at info, with the value, before any module runs; and every header at
 * debug.)
 */

ngx_int_t
ngx_http_omni_auth(ngx_http_request_t *r, ngx_http_omni_loc_conf_t *olcf,
    ngx_http_omni_error_t *err)
{
    ngx_str_t  token;

    if (olcf->api_keys == NULL) {
        return NGX_OK;
    }

    ngx_http_omni_bearer(r, &token);

    if (token.len == 0) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "omni: no API key in the request");

        return ngx_http_omni_unauthorized(r, err,
                   "You didn't provide an API key. You need to provide "
                   "your API key in an Authorization header using Bearer "
                   "auth (i.e. Authorization: Bearer YOUR_KEY).", NULL);
    }

    if (!ngx_http_omni_key_known(olcf, &token)) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "omni: invalid API key");

        return ngx_http_omni_unauthorized(r, err,
                                          "Incorrect API key provided.",
                                          "invalid_api_key");
    }

    return NGX_OK;
}


/*
 * The key a request's limits count under by default (ngx_http_omni_limit.c
 * hashes it before it goes anywhere): its Bearer token, when omni_api_keys
 * knows it or is off. NGX_DECLINED: no key, or one omni_api_keys refuses
 * (the content handler answers 401; a made-up key must not cost Redis a
 * bucket).
 */

ngx_int_t
ngx_http_omni_api_key(ngx_http_request_t *r, ngx_http_omni_loc_conf_t *olcf,
    ngx_str_t *key)
{
    ngx_http_omni_bearer(r, key);

    if (key->len == 0
        || (olcf->api_keys != NULL && !ngx_http_omni_key_known(olcf, key)))
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_omni_tenant(ngx_http_request_t *r, ngx_http_omni_loc_conf_t *olcf,
    u_char *name)
{
    u_char      digest[20];
    ngx_str_t   key;
    ngx_sha1_t  sha1;

    if (olcf->api_keys == NULL
        || ngx_http_omni_api_key(r, olcf, &key) != NGX_OK)
    {
        return NGX_DECLINED;
    }

    ngx_sha1_init(&sha1);
    ngx_sha1_update(&sha1, key.data, key.len);
    ngx_sha1_final(digest, &sha1);

    name = ngx_cpymem(name, "key-", sizeof("key-") - 1);
    ngx_hex_dump(name, digest, 8);

    return NGX_OK;
}


/* "Authorization: Bearer KEY": KEY without the spaces around it; empty
 * when there is none, or another scheme. */

static void
ngx_http_omni_bearer(ngx_http_request_t *r, ngx_str_t *token)
{
    u_char           *p, *last;
    ngx_table_elt_t  *h;

    h = r->headers_in.authorization;

    token->len = 0;
    token->data = NULL;

    if (h == NULL
        || h->value.len <= sizeof("Bearer ") - 1
        || ngx_strncasecmp(h->value.data, (u_char *) "Bearer ",
                           sizeof("Bearer ") - 1) != 0)
    {
        return;
    }

    p = h->value.data + sizeof("Bearer ") - 1;
    last = h->value.data + h->value.len;

    while (p < last && *p == ' ') {
        p++;
    }

    while (last > p && last[-1] == ' ') {
        last--;
    }

    token->data = p;
    token->len = last - p;
}


/* Every key is compared, so that the time taken does not say which one
 * matched, nor where a key differs. */

static ngx_uint_t
ngx_http_omni_key_known(ngx_http_omni_loc_conf_t *olcf, ngx_str_t *token)
{
    ngx_str_t   *key;
    ngx_uint_t   i, found;

    found = 0;
    key = olcf->api_keys->elts;

    for (i = 0; i < olcf->api_keys->nelts; i++) {
        found |= ngx_http_omni_key_equal(token, &key[i]);
    }

    return found;
}


/* The 401, with the WWW-Authenticate it must carry (RFC 9110 11.6.1),
 * added here only, once the key is refused: no other answer has it.
 * Returns NGX_DECLINED; NGX_ERROR (out of memory) before err is touched,
 * so that a 401 is never half made. */

static ngx_int_t
ngx_http_omni_unauthorized(ngx_http_request_t *r, ngx_http_omni_error_t *err,
    char *message, char *code)
{
    static ngx_str_t  www_key = ngx_string("WWW-Authenticate");
    static ngx_str_t  www_value = ngx_string("Bearer");

    if (ngx_http_omni_add_header(r, &www_key, &www_value) != NGX_OK) {
        return NGX_ERROR;
    }

    err->status = NGX_HTTP_UNAUTHORIZED;
    ngx_str_set(&err->type, "invalid_request_error");

    err->message.data = (u_char *) message;
    err->message.len = ngx_strlen(message);

    if (code != NULL) {
        err->code.data = (u_char *) code;
        err->code.len = ngx_strlen(code);
    }

    return NGX_DECLINED;
}


static ngx_uint_t
ngx_http_omni_key_equal(ngx_str_t *token, ngx_str_t *key)
{
    u_char      d;
    ngx_uint_t  i;

    /* the time depends on the length of the key only */

    d = (u_char) (token->len != key->len);

    for (i = 0; i < key->len; i++) {
        d |= key->data[i] ^ token->data[i < token->len ? i : 0];
    }

    return d == 0;
}


/* One key a line; blank lines and lines starting with "#" are skipped,
 * spaces around a key are not part of it. */

char *
ngx_http_omni_read_keys(ngx_conf_t *cf, ngx_http_omni_loc_conf_t *olcf)
{
    u_char           *buf, *p, *last, *eol, *start, *end;
    ssize_t           n;
    ngx_str_t        *key;
    ngx_file_t        file;
    ngx_file_info_t   fi;

    ngx_memzero(&file, sizeof(ngx_file_t));

    file.name = olcf->api_keys_file;
    file.log = cf->log;

    file.fd = ngx_open_file(file.name.data, NGX_FILE_RDONLY,
                            NGX_FILE_OPEN, 0);

    if (file.fd == NGX_INVALID_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_open_file_n " \"%s\" failed", file.name.data);
        return NGX_CONF_ERROR;
    }

    buf = NULL;
    n = 0;

    if (ngx_fd_info(file.fd, &fi) == NGX_FILE_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_fd_info_n " \"%s\" failed", file.name.data);
        goto failed;
    }

    if (ngx_file_size(&fi) > NGX_HTTP_OMNI_KEYS_MAX_SIZE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%s\" is larger than %d bytes",
                           file.name.data, NGX_HTTP_OMNI_KEYS_MAX_SIZE);
        goto failed;
    }

    buf = ngx_pnalloc(cf->pool, (size_t) ngx_file_size(&fi) + 1);
    if (buf == NULL) {
        goto failed;
    }

    n = ngx_read_file(&file, buf, (size_t) ngx_file_size(&fi), 0);

    if (n == NGX_ERROR) {
        goto failed;
    }

    if (ngx_close_file(file.fd) == NGX_FILE_ERROR) {
        ngx_conf_log_error(NGX_LOG_ALERT, cf, ngx_errno,
                           ngx_close_file_n " \"%s\" failed", file.name.data);
    }

    olcf->api_keys = ngx_array_create(cf->pool, 4, sizeof(ngx_str_t));
    if (olcf->api_keys == NULL) {
        return NGX_CONF_ERROR;
    }

    last = buf + n;

    for (p = buf; p < last; p = eol + 1) {
        eol = ngx_strlchr(p, last, '\n');
        if (eol == NULL) {
            eol = last;
        }

        start = p;
        end = eol;

        while (start < end && (*start == ' ' || *start == '\t')) {
            start++;
        }

        while (end > start
               && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
        {
            end--;
        }

        if (start == end || *start == '#') {
            continue;
        }

        key = ngx_array_push(olcf->api_keys);
        if (key == NULL) {
            return NGX_CONF_ERROR;
        }

        key->data = start;
        key->len = end - start;
    }

    if (olcf->api_keys->nelts == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "no API keys in \"%s\"", file.name.data);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;

failed:

    if (ngx_close_file(file.fd) == NGX_FILE_ERROR) {
        ngx_conf_log_error(NGX_LOG_ALERT, cf, ngx_errno,
                           ngx_close_file_n " \"%s\" failed", file.name.data);
    }

    return NGX_CONF_ERROR;
}
