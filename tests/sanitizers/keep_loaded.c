/* Preloaded (LD_PRELOAD) into the programs scripts/sanitize.sh asan runs: dlclose does
 * nothing, so every plugin a library loads stays mapped until the process exits.
 * Open MPI 4.1 unloads its components (mca_*.so) in MPI_Finalize and has no setting to
 * keep them; LeakSanitizer, which reports at exit, then shows what they allocated as
 * "<unknown module>" frames that no suppression can name. Kept loaded, those frames are
 * named (mca_pml_ob1.so, ...) and lsan.supp can suppress them by library, while a leak
 * whose stack is in Parallax's own code is still reported. */
int dlclose(void *handle) {
  (void)handle;
  return 0;
}
