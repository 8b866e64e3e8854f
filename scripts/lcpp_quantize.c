// lcpp_quantize.c - llama-quantize's own quantiser (llama_model_quantize in libllama, the function
// the llama-quantize tool calls) for scripts/lcpp-quant-compare, where only libllama is built (the
// tools need llama.cpp's "common" library too: ~40 more minutes on a loaded 2-core machine).
//
// build: cc -O2 -I LLAMA/include -I LLAMA/ggml/include lcpp_quantize.c -L LLAMA/build/bin -lllama
//           -lggml-base -Wl,-rpath,LLAMA/build/bin -o lcpp_quantize
// usage: lcpp_quantize IN.gguf OUT.gguf FTYPE [pure] [requantize] [imatrix]
//   FTYPE: llama_ftype's number (LLAMA_FTYPE_MOSTLY_Q4_K_M = 15 ...; 0 = all F32);
//   pure: every matrix of FTYPE's default type (llama-quantize --pure);
//   requantize: quantised input allowed (llama-quantize --allow-requantize; with FTYPE 0 it
//     dequantises a file to F32);
//   imatrix: a uniform importance matrix (every column weighted 1) for every 2-D and 3-D weight:
//     llama-quantize refuses the 1- and 2-bit IQ types without one, and llama-imatrix needs the
//     same "common" library.
#include "gguf.h"
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s IN.gguf OUT.gguf FTYPE [pure] [requantize] [imatrix]\n", argv[0]);
        return 2;
    }
    struct llama_model_quantize_params p = llama_model_quantize_default_params();
    p.ftype = (enum llama_ftype) atoi(argv[3]);
    p.nthread = 2;
    int imatrix = 0;
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "pure") == 0) p.pure = true;
        else if (strcmp(argv[i], "requantize") == 0) p.allow_requantize = true;
        else if (strcmp(argv[i], "imatrix") == 0) imatrix = 1;
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    struct llama_model_imatrix_data * im = NULL;
    float * ones = NULL;
    if (imatrix) {
        struct ggml_context * meta = NULL;
        struct gguf_init_params gp = {.no_alloc = true, .ctx = &meta};
        struct gguf_context * g = gguf_init_from_file(argv[1], gp);
        if (!g) {
            fprintf(stderr, "%s: not readable as GGUF\n", argv[1]);
            return 1;
        }
        int64_t n = gguf_get_n_tensors(g), n_im = 0, widest = 0;
        im = calloc((size_t) n + 1, sizeof *im);
        for (struct ggml_tensor * t = ggml_get_first_tensor(meta); t; t = ggml_get_next_tensor(meta, t)) {
            if (ggml_n_dims(t) < 2) continue;
            int64_t size = t->ne[0] * (ggml_n_dims(t) > 2 ? t->ne[2] : 1); // experts: one row per expert
            if (size > widest) widest = size;
            im[n_im].name = strdup(ggml_get_name(t));
            im[n_im].size = (size_t) size;
            n_im++;
        }
        ones = malloc((size_t) widest * sizeof *ones);
        for (int64_t i = 0; i < widest; i++) ones[i] = 1.0f;
        for (int64_t i = 0; i < n_im; i++) im[i].data = ones;
        im[n_im].name = NULL;
        p.imatrix = im;
        gguf_free(g);
        ggml_free(meta);
    }
    llama_backend_init();
    uint32_t rc = llama_model_quantize(argv[1], argv[2], &p);
    if (im) {
        for (struct llama_model_imatrix_data * e = im; e->name; e++) free((void *) e->name);
        free(im);
    }
    free(ones);
    if (rc != 0) {
        fprintf(stderr, "llama_model_quantize failed (%u)\n", rc);
        return 1;
    }
    return 0;
}
