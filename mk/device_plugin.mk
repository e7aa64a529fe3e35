# hamictl device-plugin's v1beta1 messages, compiled once from the .proto
# (grpcio-tools of the venv); device_plugin_api.py compiles them at first use
# where this module is missing or older than the .proto.
build: hami_runtime/tools/_device_plugin_pb2.py
hami_runtime/tools/_device_plugin_pb2.py: hami_runtime/tools/device_plugin_v1beta1.proto \
		hami_runtime/tools/device_plugin_api.py | $(VENV)/.installed
	$(PY) -I -c 'import sys; sys.path.insert(0, "."); \
		from hami_runtime.tools import device_plugin_api; device_plugin_api.emit_module(sys.argv[1])' $@
