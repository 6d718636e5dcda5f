# The two commands the README promises, plus conveniences.
.PHONY: run test bench gateway

run:        ## set up and run the embedded demo stack (gateway + controller + simulated replicas)
	./scripts/bootstrap.sh && .venv/bin/specgate up

test:       ## set up and run the whole test suite (real Redis, real vLLM CPU tier)
	./scripts/test.sh

gateway:    ## set up and run the gateway in front of REPLICA (e.g. make gateway REPLICA=http://127.0.0.1:8000)
	./scripts/bootstrap.sh && SPECGATE_REPLICAS='[{"url": "$(REPLICA)"}]' .venv/bin/specgate gateway
