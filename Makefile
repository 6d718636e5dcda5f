# The two commands the README promises, plus conveniences.
.PHONY: run test gateway

# Gateway port of `make run` and `make gateway` (`make run PORT=9000`); the
# default is `specgate gateway`'s and `specgate up`'s (specgate.DEFAULT_GATEWAY_PORT).
PORT ?= 8080

run:        ## set up and run the embedded demo stack (gateway + controller + simulated replicas) on PORT
	./scripts/bootstrap.sh && .venv/bin/specgate up --port $(PORT)

test:       ## set up and run the whole test suite (real Redis, real vLLM CPU tier)
	./scripts/test.sh

gateway:    ## set up and run the gateway on PORT in front of REPLICA (e.g. make gateway REPLICA=http://127.0.0.1:8000)
	$(if $(REPLICA),,$(error REPLICA is not set: make gateway REPLICA=http://127.0.0.1:8000))
	./scripts/bootstrap.sh && SPECGATE_REPLICAS='[{"url": "$(REPLICA)"}]' .venv/bin/specgate gateway --port $(PORT)
