/* signature.c -- the signature language of dlb_kernel functions, parsed
 * once into flat records a caller checks tensors against with no symbol
 * table (dlbridge.Function, src/python/function_sig.c).  Grammar (whitespace
 * allowed between any two tokens):
 *
 *     signature := NAME '(' [param {',' param} [',']] ')' ['->' results]
 *     param     := NAME ':' ['mut' | 'nodiff'] type
 *     results   := result | '(' [result {',' result} [',']] ')'
 *     result    := [NAME ':'] ['nodiff'] type
 *     type      := DTYPE ['[' [dims] ']']     no brackets, or "[]": 0-d
 *     dims      := '...' [',' dim {',' dim}] | dim {',' dim}
 *     dim       := NAME | INTEGER
 *
 * NAME is [A-Za-z_][A-Za-z0-9_]*; DTYPE any name dlb_dtype_from_name knows.
 * 'mut' and 'nodiff' are keywords only where a dtype follows them, so a
 * parameter may still be called mut (or nodiff), and "x: mut" reads mut as
 * a dtype.  A mut parameter is never differentiable, so 'nodiff' with 'mut'
 * is an error rather than a redundancy: it would suggest the other order
 * means something.  A result's name is the one a derivative signature binds
 * it by (signature_grad.c); names of parameters and results are one
 * namespace, and a name may not be the label ("out<k>") of an unnamed
 * result.  A dimension NAME binds the first time it appears, reading
 * parameters left to right, and must be equal everywhere after; output
 * dimensions must be literals or names some input binds.  The text is
 * untrusted (fuzzed: tests/fuzz/fuzz_signature.c): every read is bounded by
 * its length, no NUL is needed, and every count is bounded by the record
 * arrays.
 *
 * `...` (issue 25) stands for batch dimensions: any number of leading
 * axes, broadcast among the `...` arguments by NumPy's rule, that the
 * result carries in front of its own (docs/function.md, "Signatures").
 * It is only first, at most once, and sets the parameter's `batch` flag;
 * `ndim` and the dim records stay the CORE dims, so every check of a
 * named or literal dim reads the last ndim axes of a tensor.  A `...`
 * result needs a `...` input: its batch shape is the inputs' broadcast,
 * and with none there would be nothing to take it from.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"



static int perr(dlb_signature *p, size_t at, const char *msg) {
  if (p->message == NULL) {
    p->message = msg;
    p->error_pos = at;
  }
  return -1;
}

static void skip_ws(dlb_signature *p) {
  while (p->pos < p->length &&
         (p->text[p->pos] == ' ' || p->text[p->pos] == '\t' ||
          p->text[p->pos] == '\n' || p->text[p->pos] == '\r'))
    p->pos++;
}

static int is_ident_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int is_ident_char(char c) {
  return is_ident_start(c) || (c >= '0' && c <= '9');
}

/* An identifier at the cursor (after whitespace): its start and length, or
 * 0 when there is none (cursor left on the offending character). */
static size_t ident(dlb_signature *p, const char **start) {
  skip_ws(p);
  size_t b = p->pos;
  if (b >= p->length || !is_ident_start(p->text[b])) return 0;
  while (p->pos < p->length && is_ident_char(p->text[p->pos])) p->pos++;
  *start = p->text + b;
  return p->pos - b;
}

static int accept(dlb_signature *p, char c) {
  skip_ws(p);
  if (p->pos < p->length && p->text[p->pos] == c) {
    p->pos++;
    return 1;
  }
  return 0;
}

static int word_is(const char *w, size_t n, const char *lit) {
  return (size_t)n == strlen(lit) && memcmp(w, lit, (size_t)n) == 0;
}

static int find_sym(const dlb_signature *p, const char *w, size_t n) {
  for (int i = 0; i < p->nsyms; i++)
    if (p->sym_len[i] == n && memcmp(p->sym[i], w, (size_t)n) == 0) return i;
  return -1;
}

/* The keywords before a type: 'mut' (parameters) and 'nodiff', each a
 * keyword only when another word follows it (the dtype), so "mut: float32"
 * names a parameter mut.  Sets *mut / *nodiff; the cursor ends before the
 * dtype.  The errors point at the offending keyword. */
static int parse_marks(dlb_signature *p, int is_output, int *mut,
                       int *nodiff) {
  for (;;) {
    const char *w = NULL, *w2;
    size_t save = p->pos;
    size_t n = ident(p, &w);
    int is_mut = n > 0 && word_is(w, n, "mut");
    int is_nodiff = n > 0 && word_is(w, n, "nodiff");
    size_t after = p->pos;
    if (!(is_mut || is_nodiff) || ident(p, &w2) == 0) {
      p->pos = save;
      return 0;
    }
    size_t at = (size_t)(w - p->text);
    if (is_mut && is_output)
      return perr(p, at, "results cannot be 'mut': they are always written");
    if ((is_mut && *mut) || (is_nodiff && *nodiff))
      return perr(p, at, is_mut ? "'mut' given twice" : "'nodiff' given twice");
    if (*mut || *nodiff)
      return perr(p, at,
                  "'mut' with 'nodiff': a 'mut' parameter is never "
                  "differentiable anyway (drop 'nodiff')");
    *(is_mut ? mut : nodiff) = 1;
    p->pos = after;
  }
}

/* '...' at the cursor (which is on a '.'), in the dims of
 * params[p->nparams]: only first, once; on a result, only when an input
 * has one (the inputs are all parsed by then).  Sets the batch flag. */
static int parse_ellipsis(dlb_signature *p, int is_output) {
  dlb_signature_param *prm = &p->params[p->nparams];
  size_t at = p->pos;
  if (p->length - at < 3 || memcmp(p->text + at, "...", 3) != 0)
    return perr(p, at, "expected '...' (three dots: the batch dimensions)");
  if (prm->batch)
    return perr(p, at, "'...' given twice (it stands for all the batch "
                       "dimensions)");
  if (prm->ndim > 0)
    return perr(p, at, "'...' must come first: the batch dimensions lead "
                       "(write [..., n])");
  if (is_output) {
    int any = 0;
    for (int i = 0; i < p->nin; i++) any |= p->params[i].batch;
    if (!any) {
      size_t n = p->param_name_len[p->nparams];
      if (n > 0)
        snprintf(p->message_buf, sizeof p->message_buf,
                 "result '%.*s' has '...' but no input does: its batch "
                 "dimensions would come from nothing",
                 (int)(n < 64 ? n : 64), p->param_name[p->nparams]);
      else
        snprintf(p->message_buf, sizeof p->message_buf,
                 "result %d has '...' but no input does: its batch "
                 "dimensions would come from nothing",
                 p->nparams - p->nin);
      return perr(p, at, p->message_buf);
    }
  }
  prm->batch = 1;
  p->pos = at + 3;
  return 0;
}

/* type := DTYPE ['[' dims ']'], filling params[p->nparams]. */
static int parse_type(dlb_signature *p, int is_output) {
  dlb_signature_param *prm = &p->params[p->nparams];
  const char *w;
  skip_ws(p);
  size_t at = p->pos;
  size_t n = ident(p, &w);
  if (n == 0) return perr(p, p->pos, "expected a dtype name");
  char name[64];
  if ((size_t)n >= sizeof name) return perr(p, at, "unknown dtype");
  memcpy(name, w, (size_t)n);
  name[n] = '\0';
  dlb_error err;
  if (dlb_dtype_from_name(name, &prm->dtype, &err) != DLB_OK) {
    snprintf(p->message_buf, sizeof p->message_buf, "unknown dtype '%s'", name);
    return perr(p, at, p->message_buf);
  }
  prm->ndim = 0;
  prm->dim0 = p->ndims;
  prm->mut = 0;
  prm->nodiff = 0;
  prm->batch = 0;
  if (!accept(p, '[')) return 0;
  if (accept(p, ']')) return 0; /* "float32[]": 0-d */
  for (;;) {
    skip_ws(p);
    if (p->pos < p->length && p->text[p->pos] == '.') {
      if (parse_ellipsis(p, is_output) < 0) return -1;
      if (accept(p, ']')) return 0; /* "float32[...]": a batched 0-d core */
      if (!accept(p, ',')) {
        skip_ws(p);
        return perr(p, p->pos, "expected ',' or ']' after '...'");
      }
      continue;
    }
    if (prm->ndim >= DLB_MAX_NDIM) {
      skip_ws(p);
      return perr(p, p->pos, "too many dimensions (at most 64)");
    }
    dlb_signature_dim *d = &p->dims[p->ndims];
    skip_ws(p);
    size_t dat = p->pos;
    if (dat < p->length && p->text[dat] >= '0' && p->text[dat] <= '9') {
      int64_t v = 0;
      while (p->pos < p->length && p->text[p->pos] >= '0' && p->text[p->pos] <= '9') {
        int digit = p->text[p->pos] - '0';
        if (v > (INT64_MAX - digit) / 10)
          return perr(p, dat, "dimension too large");
        v = v * 10 + digit;
        p->pos++;
      }
      if (p->pos < p->length && is_ident_char(p->text[p->pos]))
        return perr(p, p->pos, "expected ',' or ']' after a dimension");
      d->kind = DLB_SIGNATURE_DIM_LITERAL;
      d->value = v;
      d->sym = -1;
      d->from_param = d->from_axis = -1;
    } else {
      n = ident(p, &w);
      if (n == 0)
        return perr(p, p->pos, "expected a dimension (a name or an integer)");
      int s = find_sym(p, w, n);
      d->value = 0;
      if (s < 0) {
        if (is_output) {
          snprintf(p->message_buf, sizeof p->message_buf,
                   "result dimension '%.*s' is not bound by any input",
                   (int)(n < 64 ? n : 64), w);
          return perr(p, dat, p->message_buf);
        }
        s = p->nsyms++;
        p->sym[s] = w;
        p->sym_len[s] = n;
        d->kind = DLB_SIGNATURE_DIM_BIND;
        d->from_param = (int16_t)p->nparams;
        d->from_axis = (int16_t)prm->ndim;
      } else {
        /* the binding record holds who bound it */
        const dlb_signature_dim *b = NULL;
        for (int i = 0; i < p->ndims; i++)
          if (p->dims[i].sym == s && p->dims[i].kind == DLB_SIGNATURE_DIM_BIND) {
            b = &p->dims[i];
            break;
          }
        d->kind = DLB_SIGNATURE_DIM_CHECK;
        d->from_param = b->from_param;
        d->from_axis = b->from_axis;
      }
      d->sym = (int16_t)s;
    }
    p->ndims++;
    prm->ndim++;
    if (accept(p, ']')) return 0;
    if (!accept(p, ',')) {
      skip_ws(p);
      return perr(p, p->pos, "expected ',' or ']' after a dimension");
    }
  }
}

/* The parameter or result named w (n bytes) so far, or -1. */
static int find_name(const dlb_signature *p, const char *w, size_t n) {
  for (int i = 0; i < p->nparams; i++)
    if (p->param_name_len[i] == n && memcmp(p->param_name[i], w, n) == 0)
      return i;
  return -1;
}

static int parse_param(dlb_signature *p) {
  const char *w;
  skip_ws(p);
  size_t at = p->pos;
  if (p->nparams >= DLB_SIGNATURE_MAX_PARAMS)
    return perr(p, at, "too many parameters (at most 64 with the results)");
  size_t n = ident(p, &w);
  if (n == 0) return perr(p, p->pos, "expected a parameter name");
  if (find_name(p, w, n) >= 0) {
    snprintf(p->message_buf, sizeof p->message_buf,
             "duplicate parameter name '%.*s'", (int)(n < 64 ? n : 64), w);
    return perr(p, at, p->message_buf);
  }
  p->param_name[p->nparams] = w;
  p->param_name_len[p->nparams] = n;
  if (!accept(p, ':')) {
    skip_ws(p);
    return perr(p, p->pos, "expected ':' after parameter name");
  }
  int mut = 0, nodiff = 0;
  if (parse_marks(p, 0, &mut, &nodiff) < 0) return -1;
  if (parse_type(p, 0) < 0) return -1;
  p->params[p->nparams].mut = (uint8_t)mut;
  p->params[p->nparams].nodiff = (uint8_t)nodiff;
  p->nparams++;
  return 0;
}

/* result := [NAME ':'] ['nodiff'] type.  A word followed by ':' is the
 * name; any other is the dtype (so "-> float32" reads as before). */
static int parse_result(dlb_signature *p) {
  skip_ws(p);
  if (p->nparams >= DLB_SIGNATURE_MAX_PARAMS)
    return perr(p, p->pos,
                "too many parameters (at most 64 with the results)");
  const char *w;
  size_t save = p->pos;
  size_t n = ident(p, &w);
  if (n > 0 && accept(p, ':')) {
    int i = find_name(p, w, n);
    if (i >= 0) {
      snprintf(p->message_buf, sizeof p->message_buf,
               i < p->nin ? "result name '%.*s' is also a parameter's"
                          : "duplicate result name '%.*s'",
               (int)(n < 64 ? n : 64), w);
      return perr(p, save, p->message_buf);
    }
    p->param_name[p->nparams] = w;
    p->param_name_len[p->nparams] = n;
  } else {
    p->pos = save;
    p->param_name[p->nparams] = NULL;
    p->param_name_len[p->nparams] = 0;
  }
  int mut = 0, nodiff = 0;
  if (parse_marks(p, 1, &mut, &nodiff) < 0) return -1;
  if (parse_type(p, 1) < 0) return -1;
  p->params[p->nparams].nodiff = (uint8_t)nodiff;
  p->nparams++;
  return 0;
}

/* After the results: no result's name may be the label of an unnamed one
 * ("out<k>", dlb_signature_param_label), or two results would answer to
 * one name when a derivative binds them.  (A parameter with such a name is
 * legal: it matters only to a derivative, whose derivation and binding
 * refuse the ambiguity.) */
static int check_labels(dlb_signature *p) {
  int nres = p->nparams - p->nin;
  if (nres < 2) return 0; /* a lone unnamed result is "out": nothing else */
  for (int r = 0; r < nres; r++) {
    if (p->param_name_len[p->nin + r] > 0) continue;
    char label[16];
    int len = snprintf(label, sizeof label, "out%d", r);
    for (int i = p->nin; i < p->nparams; i++) {
      if (p->param_name_len[i] != (size_t)len ||
          memcmp(p->param_name[i], label, (size_t)len) != 0)
        continue;
      snprintf(p->message_buf, sizeof p->message_buf,
               "result name '%s' is the label of the unnamed result %d (name "
               "that result too, or rename this one)",
               label, r);
      return perr(p, (size_t)(p->param_name[i] - p->text), p->message_buf);
    }
  }
  return 0;
}

/* The items of a list whose '(' was just read, through its ')': none, or
 * items separated by commas, a trailing comma allowed.  missing_separator
 * is the error when an item is followed by neither. */
static int parse_list(dlb_signature *p, int (*item)(dlb_signature *),
                      const char *missing_separator) {
  if (accept(p, ')')) return 0;
  for (;;) {
    if (item(p) < 0) return -1;
    if (accept(p, ')')) return 0;
    if (!accept(p, ',')) {
      skip_ws(p);
      return perr(p, p->pos, missing_separator);
    }
    if (accept(p, ')')) return 0; /* trailing comma */
  }
}

static int parse_signature(dlb_signature *p) {
  const char *w;
  size_t n = ident(p, &w);
  if (n == 0) return perr(p, p->pos, "expected the function name");
  p->name = w;
  p->name_len = n;
  if (!accept(p, '(')) {
    skip_ws(p);
    return perr(p, p->pos, "expected '(' after the function name");
  }
  if (parse_list(p, parse_param, "expected ',' or ')' after a parameter") < 0)
    return -1;
  p->nin = p->nparams;
  skip_ws(p);
  if (p->pos < p->length) {
    if (!(p->pos + 1 < p->length && p->text[p->pos] == '-' &&
          p->text[p->pos + 1] == '>'))
      return perr(p, p->pos, "expected '->' or the end of the signature");
    p->pos += 2;
    if (accept(p, '(')) {
      if (parse_list(p, parse_result,
                     "expected ',' or ')' after a result type") < 0)
        return -1;
    } else if (parse_result(p) < 0) {
      return -1;
    }
    if (check_labels(p) < 0) return -1;
    skip_ws(p);
    if (p->pos < p->length)
      return perr(p, p->pos, "unexpected text after the signature");
  }
  return 0;
}

int dlb_signature_parse(const char *text, size_t length, dlb_signature *out,
                        dlb_error *err) {
  if (out == NULL || (text == NULL && length > 0))
    return dlb_error_set(err, DLB_EINVAL,
                         "dlb_signature_parse: out is NULL, or text is NULL "
                         "with a length");
  memset(out, 0, sizeof *out);
  out->text = text != NULL ? text : "";
  out->length = length;
  if (parse_signature(out) < 0) {
    if (out->message == NULL) out->message = "malformed signature";
    return dlb_error_set(err, DLB_EINVAL, "%s (at byte %zu)", out->message,
                         out->error_pos);
  }
  return DLB_OK;
}
