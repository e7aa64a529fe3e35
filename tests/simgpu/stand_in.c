/* A driver library the simulator does not implement, built under the soname of
 * each one the tests need to see (mk/sim.mk): which of them a container gets
 * follows its NVIDIA_DRIVER_CAPABILITIES. */
__attribute__((visibility("default"))) const char hami_sim_stand_in[] = "simulated driver stand-in";
