// llama.cpp's samplers on given logits, for tests/fixtures/samplers_llama_cpp.json (scripts/make_sampler_fixture.py).
// Built against the static libraries scripts/build_llama_server.sh leaves in the llama.cpp tree:
//   scripts/make_sampler_fixture.py --llama-cpp DIR  (compiles this file, runs it, writes the record)
// Input (stdin), one item per line:
//   sampler NAME ARGS...   add a sampler to the chain, in order (names below)
//   step L0 L1 ...         apply the chain to these logits (token i has logit Li); print the candidates left
//   accept TOKEN           tell the chain a token was chosen (DRY's and the penalties' history)
// Output per step: "kept" then id:logit:p for each candidate left, in the array's order, then
// "selected" and the chosen token id (-1 when no sampler in the chain selects one).
#include "llama.h"
#include "llama-sampler.h"

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

static llama_sampler * make(const std::string & name, std::istringstream & in) {
    if (name == "top_k") { int k; in >> k; return llama_sampler_init_top_k(k); }
    if (name == "top_p") { float p; size_t m; in >> p >> m; return llama_sampler_init_top_p(p, m); }
    if (name == "min_p") { float p; size_t m; in >> p >> m; return llama_sampler_init_min_p(p, m); }
    if (name == "typical") { float p; size_t m; in >> p >> m; return llama_sampler_init_typical(p, m); }
    if (name == "temp_ext") { float t, d, e; in >> t >> d >> e; return llama_sampler_init_temp_ext(t, d, e); }
    if (name == "xtc") { float p, t; size_t m; uint32_t s; in >> p >> t >> m >> s; return llama_sampler_init_xtc(p, t, m, s); }
    if (name == "top_n_sigma") { float n; in >> n; return llama_sampler_init_top_n_sigma(n); }
    if (name == "mirostat") { int32_t v, m; uint32_t s; float tau, eta; in >> v >> s >> tau >> eta >> m;
                              return llama_sampler_init_mirostat(v, s, tau, eta, m); }
    if (name == "mirostat_v2") { uint32_t s; float tau, eta; in >> s >> tau >> eta; return llama_sampler_init_mirostat_v2(s, tau, eta); }
    if (name == "dist") { uint32_t s; in >> s; return llama_sampler_init_dist(s); }
    if (name == "dry") {  // multiplier base allowed_length penalty_last_n, then breakers as "a,b,c" token lists
        float mult, base; int32_t allowed, last_n; in >> mult >> base >> allowed >> last_n;
        std::vector<std::vector<llama_token>> breakers;
        std::string seq;
        while (in >> seq) {
            std::vector<llama_token> ids;
            std::istringstream parts(seq);
            std::string id;
            while (std::getline(parts, id, ',')) { ids.push_back(std::stoi(id)); }
            breakers.push_back(ids);
        }
        return llama_sampler_init_dry_testing(mult, base, allowed, last_n, breakers);
    }
    if (name == "penalties") { int32_t n; float r, f, p; in >> n >> r >> f >> p; return llama_sampler_init_penalties(0, n, r, f, p); }
    std::fprintf(stderr, "unknown sampler %s\n", name.c_str());
    std::exit(2);
}

int main() {
    llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string what;
        in >> what;
        if (what == "sampler") {
            std::string name;
            in >> name;
            llama_sampler_chain_add(chain, make(name, in));
        } else if (what == "accept") {
            llama_token token;
            in >> token;
            llama_sampler_accept(chain, token);
        } else if (what == "step") {
            std::vector<llama_token_data> data;
            float logit;
            while (in >> logit) { data.push_back({(llama_token) data.size(), logit, 0.0f}); }
            llama_token_data_array cur = {data.data(), data.size(), -1, false};
            llama_sampler_apply(chain, &cur);
            std::printf("kept");
            for (size_t i = 0; i < cur.size; ++i) {
                std::printf(" %d:%.9g:%.9g", cur.data[i].id, cur.data[i].logit, cur.data[i].p);
            }
            std::printf("\nselected %d\n", cur.selected >= 0 ? cur.data[cur.selected].id : -1);
        }
    }
    llama_sampler_free(chain);
    return 0;
}
